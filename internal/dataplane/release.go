package dataplane

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// AttachReleaseHook attaches the socket release hook (bpf/santa_release.c)
// to the cgroup v2 directory cgroupPath: when a socket created by a process
// in that cgroup or below closes, the hook unbinds the socket's rule set at
// once and posts its cookie to Released, so Unbind can free the rules. The
// root from CgroupV2Root covers every process. Closing the link detaches it.
func (d *Dataplane) AttachReleaseHook(cgroupPath string) (link.Link, error) {
	l, err := link.AttachCgroup(link.CgroupOptions{
		Path:    cgroupPath,
		Attach:  ebpf.AttachCgroupInetSockRelease,
		Program: d.objs.SantaRelease,
	})
	if err != nil {
		return nil, fmt.Errorf("attach socket release hook to %s: %w", cgroupPath, err)
	}
	return l, nil
}

// CgroupV2Root is where the cgroup v2 hierarchy is mounted: /sys/fs/cgroup
// on unified systems, /sys/fs/cgroup/unified on hybrid ones.
func CgroupV2Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	// mountinfo lines: id parent dev root mountpoint options [optional...] - fstype source superoptions
	unescape := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, fld := range fields {
			if fld == "-" && i >= 5 && i+1 < len(fields) && fields[i+1] == "cgroup2" {
				return unescape.Replace(fields[4]), nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("no cgroup v2 hierarchy is mounted in this mount namespace (the socket release hook needs one): " +
		"mount one (mount -t cgroup2 none /sys/fs/cgroup/unified); `ip netns exec` mounts a fresh /sys without it, " +
		"so enter a network namespace with `nsenter --net=/run/netns/NAME` instead")
}

// Released reads the cookies of closed sockets whose rule sets the release
// hook unbound.
type Released struct{ ring }

// OpenReleased starts reading released sockets. Only one reader should be open.
func (d *Dataplane) OpenReleased() (*Released, error) {
	r, err := openRing(d.objs.SantaReleased, "released sockets")
	if err != nil {
		return nil, err
	}
	return &Released{r}, nil
}

// Read blocks until a socket with a rule set closes, or the reader is
// closed, and returns the socket's cookie. The rule processor no longer
// answers for it; Unbind frees its rules.
func (r *Released) Read() (uint64, error) {
	rec, err := r.r.Read()
	if err != nil {
		return 0, err
	}
	if len(rec.RawSample) < 8 {
		return 0, fmt.Errorf("released socket record of %d bytes", len(rec.RawSample))
	}
	return binary.LittleEndian.Uint64(rec.RawSample), nil
}
