package imapserver

import "testing"

func TestFormatThreadsAndOrderedSet(t *testing.T) {
	threads := []Thread{
		{Num: 3, Children: []Thread{{Num: 6, Children: []Thread{{Num: 4, Children: []Thread{{Num: 23}}}, {Num: 44, Children: []Thread{{Num: 7, Children: []Thread{{Num: 96}}}}}}}}},
		{Children: []Thread{{Num: 1}, {Num: 2, Children: []Thread{{Num: 5}}}}},
		{Num: 9},
	}
	if got, want := FormatThreads(threads), "(3 6 (4 23)(44 7 96))((1)(2 5))(9)"; got != want {
		t.Errorf("FormatThreads: got %s, want %s", got, want)
	}
	if got, want := OrderedSet([]uint32{4, 5, 6, 2, 9, 10, 1}), "4:6,2,9:10,1"; got != want {
		t.Errorf("OrderedSet: got %s, want %s", got, want)
	}
}
