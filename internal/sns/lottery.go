package sns

// Pick chooses a worker by lottery scheduling (SNS §3.3.2, after
// Waldspurger and Weihl): worker i holds tickets inversely proportional to
// its load (1/(1+load), so an idle worker holds one ticket), and r, a
// number in [0, 1), draws one ticket. loads are the workers' reported
// loads plus their corrections.
func Pick(loads []int, r float64) int {
	total := 0.0
	for _, l := range loads {
		total += tickets(l)
	}
	draw := r * total
	for i, l := range loads {
		draw -= tickets(l)
		if draw < 0 {
			return i
		}
	}
	return len(loads) - 1
}

func tickets(load int) float64 { return 1 / float64(1+max(load, 0)) }
