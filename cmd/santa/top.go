package main

import (
	"fmt"
	"os"
	"os/signal"
	"sort"
	"time"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// topRule is one rule's rate over the last interval.
type topRule struct {
	Socket     uint64  `json:"socket"`
	ID         uint64  `json:"id"`
	HitsPerSec float64 `json:"hits_per_sec"`
	Hits       uint64  `json:"hits"`
}

// topFrame is what one refresh of santa top shows.
type topFrame struct {
	Time           time.Time `json:"time"`
	AnsweredPerSec float64   `json:"answered_per_sec"`
	MissedPerSec   float64   `json:"missed_per_sec"` // requests to bound sockets that no rule answered
	MissRatio      float64   `json:"miss_ratio"`
	Rules          []topRule `json:"rules"`
}

func topCmd(e env, g *globals) *cobra.Command {
	var cookie uint64
	var interval time.Duration
	var count, n int
	cmd := readFlag(&cobra.Command{
		Use:   "top",
		Short: "Live view of the hottest rules and the miss rate",
		Long: `top refreshes every --interval: answers and misses per second (requests to
sockets with rule sets that no rule answered: none matched, or a matching
rule's guard had moved on) of all sockets, also with --socket (the rule
processor counts them for all), and the rules with the most hits per
second (with --socket, that socket's). It runs until interrupted, or
--count refreshes. With --json it prints one JSON object per refresh.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case interval <= 0:
				return fmt.Errorf("--interval %v: must be positive (e.g. 1s, 500ms)", interval)
			case count < 0:
				return fmt.Errorf("--count %d: must not be negative (0: until interrupted)", count)
			case n < 0:
				return fmt.Errorf("--rules %d: must not be negative", n)
			}
			c, err := g.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			stop := make(chan os.Signal, 1)
			signal.Notify(stop, os.Interrupt)
			defer signal.Stop(stop)
			tty := false
			if f, ok := e.stdout.(*os.File); ok {
				tty = term.IsTerminal(int(f.Fd()))
			}
			prev, err := sampleTop(c, cookie)
			if err != nil {
				return err
			}
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for i := 0; count == 0 || i < count; i++ {
				select {
				case <-stop:
					return nil
				case <-tick.C:
				}
				cur, err := sampleTop(c, cookie)
				if err != nil {
					return err
				}
				f := cur.since(prev, n)
				prev = cur
				if g.json {
					if err := printJSON(e.stdout, f); err != nil {
						return err
					}
					continue
				}
				if tty {
					fmt.Fprint(e.stdout, "\033[H\033[2J")
				}
				w := table(e.stdout)
				fmt.Fprintf(w, "%s\tanswered %.0f/s\tmissed %.0f/s\tmiss ratio %.1f%%\n", f.Time.Format("15:04:05"),
					f.AnsweredPerSec, f.MissedPerSec, 100*f.MissRatio)
				fmt.Fprintln(w, "SOCKET\tRULE\tHITS/S\tHITS")
				for _, r := range f.Rules {
					fmt.Fprintf(w, "%d\t%d\t%.0f\t%d\n", r.Socket, r.ID, r.HitsPerSec, r.Hits)
				}
				if err := w.Flush(); err != nil {
					return err
				}
			}
			return nil
		},
	}, g)
	socketFlag(cmd, &cookie, false)
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "refresh interval")
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many refreshes (0: until interrupted)")
	cmd.Flags().IntVarP(&n, "rules", "n", 20, "rules to show")
	return cmd
}

// topSample is a snapshot of the counters top compares.
type topSample struct {
	at       time.Time
	answered uint64
	missed   uint64
	hits     map[[2]uint64]uint64 // (socket, rule) -> hits
}

func sampleTop(c *santa.Client, cookie uint64) (topSample, error) {
	s := topSample{at: time.Now(), hits: map[[2]uint64]uint64{}}
	_, counters, err := c.Health()
	if err != nil {
		return s, err
	}
	// a request whose rule's guard moved on reaches the application like a miss
	s.answered, s.missed = counters["answered"], counters["pass_no_match"]+counters["pass_invalidated"]
	var socks []api.SocketInfo
	if cookie != 0 {
		socks = []api.SocketInfo{{Cookie: cookie}}
	} else if socks, err = c.ListSockets(); err != nil {
		return s, err
	}
	for _, sock := range socks {
		stats, err := c.Stats(santa.Cookie(sock.Cookie))
		if err != nil {
			if cookie == 0 {
				continue // closed meanwhile
			}
			return s, err
		}
		for _, st := range stats {
			s.hits[[2]uint64{sock.Cookie, st.ID}] = st.Hits
		}
	}
	return s, nil
}

func (s topSample) since(prev topSample, n int) topFrame {
	dt := s.at.Sub(prev.at).Seconds()
	f := topFrame{Time: s.at, AnsweredPerSec: float64(s.answered-prev.answered) / dt,
		MissedPerSec: float64(s.missed-prev.missed) / dt}
	if total := f.AnsweredPerSec + f.MissedPerSec; total > 0 {
		f.MissRatio = f.MissedPerSec / total
	}
	for k, h := range s.hits {
		f.Rules = append(f.Rules, topRule{Socket: k[0], ID: k[1], Hits: h, HitsPerSec: float64(h-prev.hits[k]) / dt})
	}
	sort.Slice(f.Rules, func(i, j int) bool {
		a, b := f.Rules[i], f.Rules[j]
		if a.HitsPerSec != b.HitsPerSec {
			return a.HitsPerSec > b.HitsPerSec
		}
		return a.Hits > b.Hits
	})
	if len(f.Rules) > n {
		f.Rules = f.Rules[:n]
	}
	return f
}
