# Plots the index-shipping benchmark (bench/shipping_pg.sh, docs/benchmarks.md): Build-Index
# against Send-Index (plain and LZ4) per workload and transport, six panels: the backup's CPU
# per operation, network bytes per operation (WAL + index stream), the backup's device bytes
# written and read per operation, the primary's throughput, and the takeover times.
#   gnuplot -e "dir='results/shipping'; out='docs/shipping_bench.png'" scripts/plot_shipping.gp
# DIR holds plot_cpu.csv, plot_net.csv, plot_write.csv, plot_read.csv, plot_tps.csv (a header
# "run,build,send,send-lz4", then one row per "workload transport", NaN where none) and
# plot_promote.csv ("takeover,promote,first_read", one row per takeover), all written by
# bench/shipping_pg.sh. Optional: subtitle='...'. Needs gnuplot (Debian gnuplot-nox).

if (!exists("dir")) dir = "results/shipping"
if (!exists("out")) out = "docs/shipping_bench.png"
if (!exists("subtitle")) subtitle = ""

set terminal pngcairo size 1500,1250 font "sans,9" linewidth 1.1 noenhanced
set output out
set datafile separator ","
set datafile missing "NaN"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set grid ytics lc rgb "#dddddd"
set key top left box opaque font ",8"
set xtics rotate by -40 left nomirror font ",8" noenhanced
colors = "#d55e00 #0072b2 #56b4e9"
names = "Build-Index Send-Index Send-Index+LZ4"

set multiplot layout 3,2 title "Index shipping through PostgreSQL: Build-Index against Send-Index, one backup" . \
    (subtitle eq "" ? "" : "\n" . subtitle)

set title "backup CPU per operation (us, all of its processes)"
set ylabel "us / op"
set yrange [0:*]
plot for [i=1:3] dir . "/plot_cpu.csv" using (column(i + 1)):xtic(1) skip 1 lc rgb word(colors, i) title word(names, i)

set title "network bytes per operation (WAL + index stream as sent)"
set ylabel "bytes / op"
plot for [i=1:3] dir . "/plot_net.csv" using (column(i + 1)):xtic(1) skip 1 lc rgb word(colors, i) title word(names, i)

set title "backup device bytes written per operation (/proc/PID/io write_bytes)"
set ylabel "bytes / op"
plot for [i=1:3] dir . "/plot_write.csv" using (column(i + 1)):xtic(1) skip 1 lc rgb word(colors, i) title word(names, i)

set title "backup device bytes read per operation (/proc/PID/io read_bytes)"
set ylabel "bytes / op"
set yrange [0:*]
plot for [i=1:3] dir . "/plot_read.csv" using (column(i + 1)):xtic(1) skip 1 lc rgb word(colors, i) title word(names, i)

set title "primary throughput (pgbench tps, remote_memory)"
set ylabel "tps"
plot for [i=1:3] dir . "/plot_tps.csv" using (column(i + 1)):xtic(1) skip 1 lc rgb word(colors, i) title word(names, i)

set title "takeover after SIGKILL of the primary (pair: after the workloads; gb: the large load)"
set ylabel "seconds"
set style histogram rowstacked
set key outside top center horizontal
plot dir . "/plot_promote.csv" using 2:xtic(1) skip 1 lc rgb "#009e73" title "slipstream.promote(60)", \
     "" using 3 skip 1 lc rgb "#cc79a7" title "first read after it"

unset multiplot
