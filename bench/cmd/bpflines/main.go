//go:build linux

// Command bpflines turns perf samples into a per-source-line profile of the
// loaded BPF programs: it maps each sampled instruction address to the C
// line the JIT compiled it from (the programs' BTF line info and JITed line
// addresses), as bpftool would with libbfd, which Debian's lacks. The
// machines here have no PMU, so sample with the software clock:
//
//	perf record -e cpu-clock -C 1 -o perf.data -- sleep 5
//	perf script -i perf.data -F ip | go run ./bench/cmd/bpflines -top 40
//
// Run it while the programs are still loaded. Samples outside BPF programs
// are not counted. Time spent in helpers shows under the helpers' own
// symbols in `perf report`, not here.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
)

// line is where the JIT put the code of one source line of one program.
type line struct {
	addr uint64
	prog string
	text string
}

func main() {
	top := flag.Int("top", 40, "lines to print")
	flag.Parse()
	lines, err := loadedLines()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bpflines:", err)
		os.Exit(1)
	}
	counts, total := map[string]int{}, 0
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		ip, err := strconv.ParseUint(strings.TrimSpace(sc.Text()), 16, 64)
		if err != nil {
			continue
		}
		k := sort.Search(len(lines), func(i int) bool { return lines[i].addr > ip }) - 1
		if k < 0 || ip-lines[k].addr > 4096 { // not in a program
			continue
		}
		counts[lines[k].prog+" "+lines[k].text]++
		total++
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "bpflines:", err)
		os.Exit(1)
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(a, b int) bool { return counts[keys[a]] > counts[keys[b]] })
	for i, k := range keys {
		if i == *top {
			break
		}
		fmt.Printf("%6d %5.1f%%  %s\n", counts[k], 100*float64(counts[k])/float64(total), k)
	}
	fmt.Printf("%d samples in BPF programs\n", total)
}

// loadedLines lists the JITed address of every source line of every loaded
// program with line info, sorted by address.
func loadedLines() ([]line, error) {
	var out []line
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			break // no more programs
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded meanwhile
		}
		info, err := p.Info()
		p.Close()
		if err != nil {
			return nil, fmt.Errorf("program %d: %w", id, err)
		}
		addrs, ok := info.JitedLineInfos()
		if !ok {
			continue
		}
		infos, err := info.LineInfos()
		if err != nil {
			continue // no BTF line info
		}
		for i, li := range infos {
			if i >= len(addrs) {
				break
			}
			l := li.Line
			out = append(out, line{addrs[i], info.Name,
				fmt.Sprintf("%s:%d %s", l.FileName(), l.LineNumber(), strings.TrimSpace(l.Line()))})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no loaded BPF program has JITed line info (run as root, with the programs loaded)")
	}
	sort.Slice(out, func(a, b int) bool { return out[a].addr < out[b].addr })
	return out, nil
}
