# idle, for the benchmark scripts (bash): source it, then call idle before
# each measured run.

# idle: wait (at most 60 s) until the machine's busy cores over 3 s fall
# below IDLE_CORES (0.5), so a run does not start in the previous one's
# tail; the load average printed beside each figure says what else ran.
idle() {
	local a b
	for _ in $(seq 20); do
		a=$(awk '/^cpu / {print $2+$3+$4+$7+$8, $5+$6}' /proc/stat)
		sleep 3
		b=$(awk '/^cpu / {print $2+$3+$4+$7+$8, $5+$6}' /proc/stat)
		if awk -v lim="${IDLE_CORES:-0.5}" -v a="$a" -v b="$b" 'BEGIN { split(a, x, " "); split(b, y, " ");
			busy = y[1] - x[1]; all = busy + y[2] - x[2]; exit !(all > 0 && busy / all * 2 < lim) }'; then
			return
		fi
	done
}
