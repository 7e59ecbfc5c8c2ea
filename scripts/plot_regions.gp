# Plots bench/region_bench's CSV (docs/benchmarks.md, "Regions"):
#   gnuplot -e "csv='results/regions/region.csv'; out='docs/rdma_regions.png'" scripts/plot_regions.gp
# Two panels per backend: payload GB/s and CPU seconds per GB, for each scenario and method
# (per-fragment WRITEs, copy-out, regions). Needs gnuplot (Debian gnuplot-nox) and awk.

if (!exists("csv")) csv = "results/regions/region.csv"
if (!exists("out")) out = "docs/rdma_regions.png"

# The rows of one backend and method, in the CSV's scenario order.
rows(backend, method) = sprintf("< awk -F, '$1==\"%s\" && $3==\"%s\"' %s", backend, method, csv)

set terminal pngcairo size 1200,800 font "sans,9" linewidth 1.1 noenhanced
set output out
set datafile separator ","
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set grid ytics lc rgb "#dddddd"
set key below horizontal box font ",8"
set logscale y 10
set format y "%g"
set xtics rotate by -15

set multiplot layout 2,2 title "Declarative regions against per-fragment WRITEs and copy-out (2 vCPUs, loopback, 65536 rows)"
do for [b in "shm tcp"] {
  set title b . ": payload throughput (GB/s, log scale)"
  set ylabel "GB/s"
  plot rows(b, "per-fragment") using 4:xtic(2) title "per-fragment" lc rgb "#999999", \
       rows(b, "copy-out") using 4 title "copy-out" lc rgb "#d95f02", \
       rows(b, "regions") using 4 title "regions" lc rgb "#1b9e77", \
       rows(b, "regions_unpack") using 4 title "receiver Unpack" lc rgb "#7570b3"
  set title b . ": CPU seconds per GB of payload (log scale; lower is better)"
  set ylabel "CPU s/GB"
  plot rows(b, "per-fragment") using 5:xtic(2) title "per-fragment" lc rgb "#999999", \
       rows(b, "copy-out") using 5 title "copy-out" lc rgb "#d95f02", \
       rows(b, "regions") using 5 title "regions" lc rgb "#1b9e77", \
       rows(b, "regions_unpack") using 5 title "receiver Unpack" lc rgb "#7570b3"
}
unset multiplot
