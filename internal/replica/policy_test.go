package replica

import "testing"

// The strictest policy is the one that waits for the most copies; "" is
// the default's.
func TestStrictest(t *testing.T) {
	for _, c := range []struct {
		n    int
		def  Policy
		ps   []Policy
		want Policy
	}{
		{3, One, nil, One},
		{3, One, []Policy{"", Quorum, One}, Quorum},
		{3, Quorum, []Policy{One, All, Quorum}, All},
		{3, All, []Policy{"", One}, All},
		{1, One, []Policy{Quorum, All}, One}, // one copy: all wait for 1
		{2, One, []Policy{Quorum}, Quorum},   // 2 of 2
	} {
		if got := Strictest(c.n, c.def, c.ps...); got != c.want {
			t.Errorf("Strictest(%d, %q, %q) = %q, want %q", c.n, c.def, c.ps, got, c.want)
		}
	}
}
