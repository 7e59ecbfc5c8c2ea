# Plots bench/shuffle_pg.sh's results/shuffle/shuffle.csv (docs/benchmarks.md, "The SQL shuffle"):
#   gnuplot -e "csv='results/shuffle/shuffle.csv'; out='docs/shuffle_bench.png'; rows=10000000" \
#     scripts/plot_shuffle.gp
# One bar per method: rows per second across the three nodes (best round).
if (!exists("csv")) csv = "results/shuffle/shuffle.csv"
if (!exists("out")) out = "docs/shuffle_bench.png"
if (!exists("rows")) rows = 0

set terminal pngcairo size 800,450 font "sans,9" noenhanced
set output out
set datafile separator ","
set style data histograms
set style fill solid 0.8 border -1
set boxwidth 0.7
set grid ytics lc rgb "#dddddd"
set key off
set ylabel "million rows per second (3 nodes)"
set title sprintf("Repartitioning %d rows across 3 local nodes (2 vCPUs): slipstream.shuffle against postgres_fdw", rows)
set yrange [0:*]
plot csv every ::1 using ($3 / 1e6):xtic(1) lc rgb "#1b9e77", \
     "" every ::1 using 0:($3 / 1e6):(sprintf("%.2f", $3 / 1e6)) with labels offset 0,0.7
