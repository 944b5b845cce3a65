package main

import (
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestOperationsDocNamesEveryFlag checks that the synopsis in
// docs/operations.md names every flag of santad, with its shorthand if it
// has one.
func TestOperationsDocNamesEveryFlag(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := strings.Cut(string(doc), "## Command line\n\n```\n")
	synopsis, _, _ := strings.Cut(after, "```")
	if synopsis == "" {
		t.Fatal(`docs/operations.md has no "## Command line" synopsis`)
	}
	newRoot().PersistentFlags().VisitAll(func(f *pflag.Flag) {
		want := "[--" + f.Name
		if f.Shorthand != "" {
			want = "[-" + f.Shorthand + "|--" + f.Name
		}
		if !strings.Contains(synopsis, want) {
			t.Errorf("docs/operations.md's synopsis does not name %s...]:\n%s", want, synopsis)
		}
	})
}
