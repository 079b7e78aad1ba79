package main

import (
	"os"
	"testing"
)

// docs/configuration.md is what `quill config reference` prints, from the
// same definition as the flags of quill serve: the two cannot drift.
func TestConfigurationDocIsCurrent(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != configReference() {
		t.Fatal("docs/configuration.md is stale: regenerate it with `go run ./cmd/quill config reference > docs/configuration.md`")
	}
}
