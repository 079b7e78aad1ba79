package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestSearchAgainstQuill runs the large-mailbox workload against a real
// `quill serve` on a small INBOX: filled with MULTIAPPEND and LITERAL+,
// every answer must be right; a second run times the same INBOX without
// filling; an INBOX of another size is refused. Another user's INBOX is
// filled the way a server without MULTIAPPEND and LITERAL+ gets it (one
// message an APPEND, synchronizing literals), in two steps.
func TestSearchAgainstQuill(t *testing.T) {
	addrs, data, pid := startQuill(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	users := GenerateUsers(2, "search.example", `search "pass" \1`)
	createUsers(t, ctx, addrs["HTTP"], data, users)

	var progress strings.Builder
	cfg := SearchConfig{Addr: addrs["IMAP"], User: users[0].Address, Password: users[0].Password,
		Messages: 1200, Fill: true, Warmup: 1, Repeat: 2, Progress: &progress}
	rep, err := RunSearch(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Appended != 1200 || rep.Batch != FillBatch || !rep.LiteralPlus || !strings.Contains(progress.String(), "appended    1200 of 1200") {
		t.Errorf("fill: %d appended, %d an APPEND, LITERAL+ %v; progress:\n%s", rep.Appended, rep.Batch, rep.LiteralPlus, progress.String())
	}
	checkSearchReport(t, rep, 2)

	cfg.Fill, cfg.Repeat, cfg.ServerPIDs = false, 1, []int{pid}
	if rep, err = RunSearch(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if rep.Appended != 0 {
		t.Errorf("a run without --fill appended %d", rep.Appended)
	}
	checkSearchReport(t, rep, 1)
	// With the server's PID, the CPU the server and the rest of the
	// machine used is reported per command and for the run.
	if runtime.GOOS == "linux" {
		var text strings.Builder
		rep.WriteText(&text)
		if rep.CPU == nil || rep.CPU.Server == nil || rep.Commands[0].CPU == nil || rep.Commands[0].CPU.Other == nil ||
			!strings.Contains(text.String(), "everything else") {
			t.Errorf("no CPU report with --server-pid: %+v\n%s", rep.CPU, text.String())
		}
	}
	cfg.ServerPIDs = nil

	cfg.Messages = 1300
	if _, err := RunSearch(ctx, cfg); err == nil || !strings.Contains(err.Error(), "holds 1200 messages, not 1300") {
		t.Errorf("an INBOX of 1200 for 1300: %v", err)
	}
	cfg.Messages = 1000
	if _, err := RunSearch(ctx, cfg); err == nil || !strings.Contains(err.Error(), "holds 1200 messages, more than --messages 1000") {
		t.Errorf("an INBOX of 1200 for 1000: %v", err)
	}

	plain := SearchConfig{Addr: addrs["IMAP"], User: users[1].Address, Password: users[1].Password,
		Messages: 40, FillOnly: true, plainAppend: true}
	if rep, err = RunSearch(ctx, plain); err != nil || rep.Appended != 40 || len(rep.Commands) != 0 {
		t.Fatalf("fill only: %+v, %v", rep, err)
	}
	plain.Messages, plain.FillOnly, plain.Fill, plain.Repeat = 70, false, true, 1
	if rep, err = RunSearch(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if rep.Appended != 30 || rep.Batch != 1 || rep.LiteralPlus {
		t.Errorf("second fill: %d appended, %d an APPEND, LITERAL+ %v", rep.Appended, rep.Batch, rep.LiteralPlus)
	}
	checkSearchReport(t, rep, 1)

	cfg.Password = "wrong"
	if _, err := RunSearch(ctx, cfg); err == nil || !strings.Contains(err.Error(), "LOGIN "+users[0].Address+": NO") || strings.Contains(err.Error(), "wrong") {
		t.Errorf("a wrong password: %v", err)
	}
}

func checkSearchReport(t *testing.T, rep *SearchReport, repeat int) {
	t.Helper()
	if rep.Wrong != 0 || len(rep.Commands) != len(LargeCommands(rep.Messages)) {
		t.Errorf("%d wrong of %d commands: %+v", rep.Wrong, len(rep.Commands), rep.Commands)
	}
	for _, c := range rep.Commands {
		if c.Latency.Count != repeat || c.Latency.Mean <= 0 || c.Results != c.Want {
			t.Errorf("%s: %+v", c.Command, c)
		}
	}
	var text, js bytes.Buffer
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "wrong answers: 0 of 10") || strings.Contains(text.String(), "WRONG") {
		t.Errorf("text report (%v):\n%s", err, text.String())
	}
	var back SearchReport
	if err := rep.WriteJSON(&js); err != nil || json.Unmarshal(js.Bytes(), &back) != nil || len(back.Commands) != len(rep.Commands) || back.Messages != rep.Messages {
		t.Errorf("JSON report (%v):\n%s", err, js.String())
	}
}

// A wrong answer, or answers that varied between runs, are marked.
func TestSearchReportMarksWrongAnswers(t *testing.T) {
	rep := &SearchReport{Workload: "search", Messages: 10, Warmup: 1, Repeat: 3, Wrong: 2, Commands: []CommandReport{
		{Command: "SEARCH TEXT word5", Results: 1, Want: 1},
		{Command: `SEARCH SUBJECT "topic 7"`, Results: 10, Want: 1},
		{Command: "SEARCH UNSEEN", Results: 10, Want: 10, Varied: true},
	}}
	var b strings.Builder
	rep.WriteText(&b)
	lines := strings.Split(b.String(), "\n")
	var marked []string
	for _, l := range lines {
		if strings.Contains(l, "WRONG") {
			marked = append(marked, strings.Fields(l)[0]+" "+strings.Fields(l)[1])
		}
	}
	if strings.Join(marked, ",") != "SEARCH SUBJECT,SEARCH UNSEEN" || !strings.Contains(b.String(), "(answers varied)") || !strings.Contains(b.String(), "wrong answers: 2 of 3") {
		t.Errorf("report:\n%s", b.String())
	}
}
