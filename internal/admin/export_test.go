package admin

import "time"

// SetSessionRecheck shortens how often administrators' sessions are
// checked against their profiles, for a test; it returns the undo.
func SetSessionRecheck(d time.Duration) func() {
	old := sessionRecheck
	sessionRecheck = d
	return func() { sessionRecheck = old }
}
