package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/santa-offload/santa/internal/testbed"
)

// findBinary finds a program of the build: next to this executable first
// (make build puts santad, santa and santa-demo in bin/), then on PATH.
func findBinary(name string) (string, error) {
	where := "this program's directory"
	if exe, err := os.Executable(); err == nil {
		dir := filepath.Dir(exe)
		where = dir
		if p := filepath.Join(dir, name); isExecutable(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return filepath.Abs(p)
	}
	return "", fmt.Errorf("%s is neither in %s nor on PATH: run make build (it builds bin/%s next to bin/santa-demo)", name, where, name)
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// findPythonClient finds clients/python of the source tree: above this
// executable's directory (bin/..), else in the working directory or one of
// its parents (go test runs in cmd/santa-demo).
func findPythonClient() (string, error) {
	var roots []string
	if exe, err := os.Executable(); err == nil {
		roots = append(roots, filepath.Dir(filepath.Dir(exe)))
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			roots = append(roots, d)
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	for _, r := range roots {
		dir := filepath.Join(r, "clients", "python")
		if isFile(filepath.Join(dir, "santa", "__init__.py")) && isFile(filepath.Join(dir, "examples", "listing1.py")) {
			return dir, nil
		}
	}
	return "", errors.New("clients/python (with examples/listing1.py) not found above this program nor the working directory: run santa-demo from the source tree")
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// copyPythonClient copies the Python client's package and Listing 1 to dst,
// readable by every user (the clone may sit where uid nobody cannot look).
func copyPythonClient(src, dst string) error {
	for _, sub := range []string{"santa", "examples"} {
		err := filepath.WalkDir(filepath.Join(src, sub), func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(src, p)
			if err != nil {
				return err
			}
			to := filepath.Join(dst, rel)
			switch {
			case e.IsDir() && e.Name() == "__pycache__":
				return filepath.SkipDir
			case e.IsDir():
				return os.MkdirAll(to, 0o755)
			case !e.Type().IsRegular():
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, b, 0o644)
		})
		if err != nil {
			return fmt.Errorf("copy the Python client: %w", err)
		}
	}
	return nil
}

// tail returns the last n lines of s, indented.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

// bpffsPrefix and runPrefix name what a demo's santad pins and keeps:
// /sys/fs/bpf/santa-demo-<pid> and /run/santa-demo-<pid>-<random>.
const (
	bpffsPrefix = "/sys/fs/bpf/santa-demo-"
	runPrefix   = "/run/santa-demo-"
)

// bpffsDir is where this demo's santad pins (its --bpffs).
func bpffsDir() string { return bpffsPrefix + strconv.Itoa(os.Getpid()) }

// newSantad configures (does not start) a demo's santad for the interface
// dev of the namespace ns, with its socket and state in dir.
func newSantad(bin, dir, ns, dev string) *testbed.Santad {
	return testbed.NewSantad(bin, ns, dir, bpffsDir(), "--interface", dev)
}

// stopSantad stops santad and then runs `santad cleanup`: that detaches XDP
// and removes the pins and the journal, which a stopped santad keeps on
// purpose (the next one would take over from them).
func stopSantad(s *testbed.Santad) error {
	return errors.Join(s.Stop(syscall.SIGTERM), s.Cleanup())
}

// removeStaleSantad cleans up after demos that were killed before they
// could (SIGKILL): their santad stopped with them (Pdeathsig) but left its
// pins and state, by design. It runs `santad cleanup` for every
// /sys/fs/bpf/santa-demo-<pid> and removes /run/santa-demo-<pid>-* whose
// pid is gone, and returns what it removed.
func removeStaleSantad(bin string) ([]string, error) {
	dead := func(path, prefix string) (int, bool) {
		f := strings.SplitN(strings.TrimPrefix(path, prefix), "-", 2)
		pid, err := strconv.Atoi(f[0])
		if err != nil || pid <= 0 || pid == os.Getpid() {
			return 0, false
		}
		err = syscall.Kill(pid, 0)
		return pid, errors.Is(err, syscall.ESRCH)
	}
	runDirs := map[int][]string{}
	dirs, _ := filepath.Glob(runPrefix + "*")
	for _, d := range dirs {
		if pid, ok := dead(d, runPrefix); ok {
			runDirs[pid] = append(runDirs[pid], d)
		}
	}
	var removed []string
	var errs []error
	pins, _ := filepath.Glob(bpffsPrefix + "*")
	for _, p := range pins {
		pid, ok := dead(p, bpffsPrefix)
		if !ok {
			continue
		}
		dir := filepath.Join(os.TempDir(), "santa-demo-no-state")
		if d := runDirs[pid]; len(d) > 0 {
			dir = d[0]
		}
		if err := testbed.NewSantad(bin, "", dir, p).Cleanup(); err != nil {
			errs = append(errs, fmt.Errorf("--bpffs %s: %w", p, err))
			continue
		}
		removed = append(removed, p)
	}
	for _, ds := range runDirs {
		for _, d := range ds {
			if err := os.RemoveAll(d); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, d)
		}
	}
	return removed, errors.Join(errs...)
}
