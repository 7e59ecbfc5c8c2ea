# Plots the replication benchmark (bench/replication_pg.sh, docs/benchmarks.md): the tps of
# every replicated configuration as a ratio to the no-replication baseline of its table type,
# one bar per workload.
#   gnuplot -e "data='results/replication/replication_ratios.csv'; out='docs/replication_bench.png'" \
#     scripts/plot_replication.gp
# DATA: a header "config,WORKLOAD..." then one row per configuration (NaN where none).
# Optional: workloads='tpcb ycsb-a' (the columns' names, in order), subtitle='...'.
# Needs gnuplot (Debian gnuplot-nox).

if (!exists("data")) data = "results/replication/replication_ratios.csv"
if (!exists("out")) out = "docs/replication_bench.png"
if (!exists("workloads")) workloads = "tpcb ycsb-a"
if (!exists("subtitle")) subtitle = ""
label(w) = (w eq "tpcb") ? "TPC-B" : ((w eq "ycsb-a") ? "YCSB A" : w)

set terminal pngcairo size 1000,480 font "sans,9" linewidth 1.2
set output out
set datafile separator ","
set datafile missing "NaN"
set title "throughput with replication / without (same table type, same run)" . \
    (subtitle eq "" ? "" : "\n{/*0.85 " . subtitle . "}") enhanced
set ylabel "tps ratio to the baseline"
set yrange [0:*]
set grid ytics lc rgb "#dddddd"
set key top right box opaque font ",8"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set xtics rotate by -35 left nomirror font ",8" noenhanced
set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb "#555555" front
colors = "#0072b2 #d55e00 #009e73 #cc79a7"
plot for [i=1:words(workloads)] data using (column(i + 1)):xtic(1) skip 1 \
     lc rgb word(colors, i) title label(word(workloads, i))
