// Package bench is Quill's load generator: it drives a mail server over SMTP
// and POP3 with a synthetic workload and reports throughput and latency.
//
// It implements the synthetic workload of Porcupine §6.1 (Saito, Bershad and
// Levy, "Manageability, Availability and Performance in Porcupine", TOCS
// 2000):
//
//   - each request picks a user from a Zipf distribution with alpha 1.3
//     (ZipfChooser);
//   - messages have a mean size of 4.7 KB with a fat tail up to 1 MiB
//     (SizeDist: a log-normal clipped to [200 B, 1 MiB], its location solved
//     so that the clipped mean is 4.7 KB);
//   - 90% of requests are SMTP sessions that deliver one message to one user,
//     10% are POP3 sessions that log in as one user, retrieve every message
//     waiting and delete it; a user has at most one POP3 session at a time
//     (a draw that hits a user whose session is still running is redrawn);
//   - the generator either runs a fixed number of closed-loop workers or
//     probes: it raises the number of outstanding requests step by step until
//     at least 10% of the requests of a step miss a 2 s deadline (Probe), and
//     reports the step with the best throughput.
//
// As in the paper, throughput is the number of messages delivered per second;
// retrievals are part of the load but are not counted in that figure.
//
// It also has the large-mailbox workload of issue 13 (RunSearch, large.go):
// one INBOX of generated messages, filled over IMAP, and the SELECT, FETCH,
// SEARCH and SORT commands a client sends on it, timed one after the other
// and their answers checked against what the generator put in. Its client
// (RawIMAP) is written by hand so that every server gets the same bytes.
//
// The workload parts (user chooser, size distribution, message builder,
// statistics and the probe controller) are pure code; Run does the network
// I/O and keeps every operation under a deadline, so a run ends by itself.
package bench
