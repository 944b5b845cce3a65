package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// TestInstallUnitFollowsPrefix runs `make install` with another PREFIX into
// a DESTDIR: the systemd unit must start the santad it installed and name
// the docs where they went, not /usr/local's.
func TestInstallUnitFollowsPrefix(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and installs everything")
	}
	dest := t.TempDir()
	out, err := exec.Command("make", "-s", "-C", "../..", "install", "DESTDIR="+dest, "PREFIX=/opt/santa").CombinedOutput()
	if err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	unit, err := os.ReadFile(filepath.Join(dest, "etc/systemd/system/santad.service"))
	if err != nil {
		t.Fatal(err)
	}
	paths := regexp.MustCompile(`(?m)^(ExecStart=|Documentation=file://)(\S+)`).FindAllSubmatch(unit, -1)
	if len(paths) != 2 {
		t.Fatalf("want the unit's ExecStart and Documentation, found %q in:\n%s", paths, unit)
	}
	for _, m := range paths {
		if _, err := os.Stat(filepath.Join(dest, string(m[2]))); err != nil {
			t.Errorf("%s%s: not installed (%v)", m[1], m[2], err)
		}
	}
}
