# Plots the rdma benchmarks (docs/benchmarks.md) from the CSV files of rdma_bench and
# channel_bench:
#   gnuplot -e "csv='results/rdma'; out='docs'" scripts/plot_rdma.gp
# reads CSV/transport.csv and CSV/channel.csv and writes four PNGs into OUT:
#   rdma_transport_bw.png       WRITE bandwidth vs message size, with memcpy, raw TCP and UCX
#   rdma_transport_lat.png      WRITE latency vs message size, with memcpy and raw TCP
#   rdma_channel_throughput.png throughput test vs data size, 1..7 receive buffers of 64 KiB
#   rdma_channel_consume.png    consume test vs receive-buffer size, single vs multi buffer
# Needs gnuplot (Debian gnuplot-nox), awk and sort.

if (!exists("csv")) csv = "results/rdma"
if (!exists("out")) out = "docs"
transport = csv . "/transport.csv"
channel = csv . "/channel.csv"

# Rows of transport.csv for one test ("bw" or "lat") and series, in size order.
rows(test, series) = sprintf("< awk -F, '$1==\"%s\" && $2==\"%s\"' %s | sort -t, -k3,3n", \
                             test, series, transport)
# Rows of channel.csv for a backend, mode, buffer count, buffer size (0: any), data size
# (0: any) and thread count, sorted by the column that varies (5: data size, 4: buffer size).
chfilter(backend, mode, buffers, bufsize, datasize, threads) = sprintf( \
  "$1==\"%s\" && $2==\"%s\" && $3==%d && (%d==0 || $4==%d) && (%d==0 || $5==%d) && $6==%d", \
  backend, mode, buffers, bufsize, bufsize, datasize, datasize, threads)
chrows(backend, mode, buffers, bufsize, datasize, threads, sortcol) = sprintf( \
  "< awk -F, '%s' %s | sort -t, -k%d,%dn", \
  chfilter(backend, mode, buffers, bufsize, datasize, threads), channel, sortcol, sortcol)

set terminal pngcairo size 760,460 font "sans,9" linewidth 1.2
set datafile separator ","
set grid lc rgb "#dddddd"
set key top left box opaque font ",8"
set logscale x 2
set logscale y 10
set format y "%g"
set xtics ("8" 8, "64" 64, "512" 512, "4K" 4096, "32K" 32768, "256K" 262144, \
           "2M" 2097152, "4M" 4194304)

# 1. Transport bandwidth.
set output out . "/rdma_transport_bw.png"
set title "WRITE bandwidth vs message size (2 vCPUs, loopback; window 128)"
set xlabel "message size (bytes)"
set ylabel "MiB/s"
plot rows("bw", "memcpy") using 3:6 with linespoints pt 7 ps 0.5 lc rgb "#888888" \
       title "memcpy loop", \
     rows("bw", "raw_tcp") using 3:6 with linespoints pt 7 ps 0.5 lc rgb "#e69f00" \
       title "raw loopback TCP", \
     rows("bw", "shm") using 3:6 with linespoints pt 5 ps 0.5 lc rgb "#0072b2" \
       title "shm WRITE", \
     rows("bw", "tcp") using 3:6 with linespoints pt 5 ps 0.5 lc rgb "#d55e00" \
       title "tcp WRITE", \
     rows("bw", "ucx_tcp_put") using 3:6 with linespoints pt 9 ps 1.0 lc rgb "#009e73" \
       title "UCX ucp\\_put\\_bw (tcp)"

# 2. Transport latency (column 10: median microseconds).
set output out . "/rdma_transport_lat.png"
set title "latency vs message size (median; WRITE until completion, TCP until a 1-byte answer)"
set ylabel "microseconds"
plot rows("lat", "memcpy") using 3:10 with linespoints pt 7 ps 0.5 lc rgb "#888888" \
       title "memcpy", \
     rows("lat", "raw_tcp") using 3:10 with linespoints pt 7 ps 0.5 lc rgb "#e69f00" \
       title "raw TCP ping-pong", \
     rows("lat", "shm") using 3:10 with linespoints pt 5 ps 0.5 lc rgb "#0072b2" \
       title "shm WRITE", \
     rows("lat", "tcp") using 3:10 with linespoints pt 5 ps 0.5 lc rgb "#d55e00" \
       title "tcp WRITE", \
     rows("lat", "shm_package") using 3:10 with lines dt 2 lc rgb "#0072b2" \
       title "shm WRITE + fenced WRITE (a channel package)", \
     rows("lat", "tcp_package") using 3:10 with lines dt 2 lc rgb "#d55e00" \
       title "tcp WRITE + fenced WRITE (a channel package)"

# 3. Channel throughput test against data size, per buffer count, shm and tcp side by side.
set terminal pngcairo size 900,420 font "sans,9" linewidth 1.2
set output out . "/rdma_channel_throughput.png"
set xtics ("8" 8, "128" 128, "2K" 2048, "32K" 32768, "512K" 524288, "8M" 8388608, \
           "128M" 134217728, "1G" 1073741824)
set xlabel "data size (bytes)"
set ylabel "MiB/s"
set key bottom right box opaque font ",8"
set multiplot layout 1,2 title "channel throughput test, receive buffers of 64 KiB, 1 sender thread"
do for [backend in "shm tcp"] {
  set title backend
  plot for [n=1:7] chrows(backend, "throughput", n, 65536, 0, 1, 5) using 5:11 \
       with linespoints pt 7 ps 0.4 lc n title sprintf("%d buffer%s", n, n > 1 ? "s" : "")
}
unset multiplot

# 4. Channel consume test against receive-buffer size, single vs multi buffer, 64 MiB of data.
set output out . "/rdma_channel_consume.png"
set xtics ("4K" 4096, "16K" 16384, "64K" 65536, "256K" 262144, "1M" 1048576, "4M" 4194304, \
           "16M" 16777216, "64M" 67108864)
set xlabel "receive-buffer size (bytes)"
set key top left box opaque font ",8"
set multiplot layout 1,2 \
    title "channel consume test (receiver reads every byte), 64 MiB of data, 1 sender thread"
do for [backend in "shm tcp"] {
  set title backend
  plot for [n in "1 2 4 7"] chrows(backend, "consume", n + 0, 0, 67108864, 1, 4) using 4:11 \
       with linespoints pt 7 ps 0.5 lw (n eq "1" ? 2 : 1) \
       title (n eq "1" ? "single buffer" : n . " buffers")
}
unset multiplot
