//go:build linux

package testbed

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// NetnsDir is where `ip netns add` keeps the named network namespaces.
const NetnsDir = "/run/netns"

// Do runs f on a locked OS thread that has joined the named network
// namespace (a name under /run/netns, as made by `ip netns add`), then
// returns the thread to the namespace it came from.
//
// Everything f creates that belongs to a network namespace (sockets,
// netlink sockets, XDP attachments by ifindex, bpf_link attachments) is
// created in ns and stays there after Do returns; such objects can then be
// used from any goroutine. Goroutines started by f do NOT run in ns.
//
// If the thread cannot be returned to its original namespace it is left
// locked, so the Go runtime discards it instead of reusing it.
func Do(ns string, f func() error) error {
	target, err := unix.Open(filepath.Join(NetnsDir, ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open netns %q: %w", ns, err)
	}
	defer unix.Close(target)

	runtime.LockOSThread()
	self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
	orig, err := unix.Open(self, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open own netns: %w", err)
	}
	defer unix.Close(orig)

	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %q: %w", ns, err)
	}
	restored := false
	defer func() {
		if restored {
			runtime.UnlockOSThread()
		}
		// else: keep the thread locked; it dies with this goroutine.
	}()

	ferr := f()

	if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("restore netns after %q: %w (function error: %v)", ns, err, ferr)
	}
	restored = true
	return ferr
}

// Command returns an exec.Cmd running name with args inside the network
// namespace ns (via `ip netns exec`, which also mounts a sysfs of that
// namespace, so /sys/class/net shows its interfaces). An empty ns runs the
// command in the caller's namespace.
func Command(ctx context.Context, ns, name string, args ...string) *exec.Cmd {
	if ns == "" {
		return exec.CommandContext(ctx, name, args...)
	}
	full := append([]string{"netns", "exec", ns, name}, args...)
	return exec.CommandContext(ctx, "ip", full...)
}

// Run runs a command inside ns (see Command) and returns its combined
// output. A non-zero exit is an error that includes the output.
func Run(ns, name string, args ...string) (string, error) {
	cmd := Command(context.Background(), ns, name, args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if err != nil {
		where := ns
		if where == "" {
			where = "host"
		}
		return out.String(), fmt.Errorf("[%s] %s %s: %w: %s", where, name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// nsExists reports whether a named namespace exists.
func nsExists(ns string) bool {
	_, err := os.Stat(filepath.Join(NetnsDir, ns))
	return err == nil
}
