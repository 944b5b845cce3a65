package dnsctl

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Asker asks a DNS server over UDP, from a pool of connected sockets so
// that many questions can be in flight at once.
type Asker struct {
	Server  netip.AddrPort
	Timeout time.Duration // per try
	Tries   int

	// Silence, if set, is called when the server stops answering (true:
	// ErrServerSilent from then on) and when it answers again (false),
	// from the goroutine of the Ask that tells.
	Silence func(silent bool)

	pool    chan *asker
	conns   []*net.UDPConn // the pool's sockets, for Stop
	stopped atomic.Bool
	// lastAnswer is when the server last answered (UnixNano); silent:
	// a question got no answer in all its tries and the server answered
	// none while it was asked. Then one question at a time is asked
	// (probing), the others fail at once, until the server answers.
	lastAnswer atomic.Int64
	silent     atomic.Bool
	probing    atomic.Bool
}

// ErrStopped is the error of an Ask that Stop ended.
var ErrStopped = errors.New("the controller is stopping")

// ErrServerSilent is the error of an Ask while the server is silent: it
// answered nothing for a question's Tries × Timeout. A hung server would
// otherwise hold every question for that long, and a controller with
// thousands of questions for many minutes.
var ErrServerSilent = errors.New("the server is silent (it answered nothing for a question's tries): asking it one question at a time until it answers")

// asker is one socket of the pool with its receive buffer and the copy of
// the query it sends, reused by every question asked on it (a million fresh
// 64 KiB buffers cost the controller more CPU than the questions).
type asker struct {
	conn  *net.UDPConn
	buf   []byte
	query []byte
}

// NewAsker opens parallel sockets connected to server.
func NewAsker(server netip.AddrPort, parallel int, timeout time.Duration, tries int) (*Asker, error) {
	a := &Asker{Server: server, Timeout: timeout, Tries: tries, pool: make(chan *asker, parallel)}
	for i := 0; i < parallel; i++ {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(server))
		if err != nil {
			a.Close()
			return nil, fmt.Errorf("open a socket to ask %v: %w", server, err)
		}
		a.pool <- &asker{conn: c, buf: make([]byte, 65535)}
		a.conns = append(a.conns, c)
	}
	return a, nil
}

// Stop ends every Ask in flight at once, and makes every later one fail,
// with ErrStopped: a hung server would hold a stop for Tries × Timeout
// per question in flight.
func (a *Asker) Stop() {
	a.stopped.Store(true)
	for _, c := range a.conns {
		c.SetDeadline(time.Now())
	}
}

// Close closes the sockets; no Ask may be running.
func (a *Asker) Close() {
	for {
		select {
		case s := <-a.pool:
			s.conn.Close()
		default:
			return
		}
	}
}

// Ask sends query with a fresh random ID and returns the server's reply,
// its ID set back to the query's. Replies with another ID (late answers to
// an earlier try) are skipped. While the server is silent (ErrServerSilent)
// only one Ask at a time asks it.
func (a *Asker) Ask(query []byte) ([]byte, error) {
	if len(query) < headerLen {
		return nil, fmt.Errorf("query of %d bytes", len(query))
	}
	if a.silent.Load() {
		if !a.probing.CompareAndSwap(false, true) {
			return nil, fmt.Errorf("ask %v: %w", a.Server, ErrServerSilent)
		}
		defer a.probing.Store(false)
	}
	start := time.Now().UnixNano()
	reply, err := a.ask(query)
	switch {
	case err == nil:
		a.lastAnswer.Store(time.Now().UnixNano())
		if a.silent.Swap(false) && a.Silence != nil {
			a.Silence(false)
		}
	case errors.Is(err, errUnanswered) && a.lastAnswer.Load() < start:
		if !a.silent.Swap(true) && a.Silence != nil {
			a.Silence(true)
		}
	}
	return reply, err
}

// errUnanswered is why ask returns no reply after all its tries.
var errUnanswered = errors.New("no answer")

// noAnswer reports whether err says the server did not answer: it is
// silent, or a question got no reply in all its tries.
func noAnswer(err error) bool {
	return errors.Is(err, errUnanswered) || errors.Is(err, ErrServerSilent)
}

// ask is Ask on a socket of the pool.
func (a *Asker) ask(query []byte) ([]byte, error) {
	s := <-a.pool
	defer func() { a.pool <- s }()
	c, buf := s.conn, s.buf
	s.query = append(s.query[:0], query...)
	q := s.query
	var err error
	for try := 0; try < max(a.Tries, 1); try++ {
		id := uint16(rand.Uint32())
		binary.BigEndian.PutUint16(q, id)
		if err = c.SetDeadline(time.Now().Add(a.Timeout)); err != nil {
			return nil, err
		}
		if a.stopped.Load() { // after the deadline: a Stop since has set its own
			return nil, fmt.Errorf("ask %v: %w", a.Server, ErrStopped)
		}
		if _, err = c.Write(q); err != nil {
			return nil, fmt.Errorf("ask %v: %w", a.Server, err)
		}
		for {
			var n int
			n, err = c.Read(buf)
			if err != nil {
				break
			}
			if n >= headerLen && binary.BigEndian.Uint16(buf) == id {
				reply := bytes.Clone(buf[:n])
				copy(reply, query[:2])
				return reply, nil
			}
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, fmt.Errorf("ask %v: %w", a.Server, err)
		}
	}
	if a.stopped.Load() { // the last try's deadline may be Stop's
		return nil, fmt.Errorf("ask %v: %w", a.Server, ErrStopped)
	}
	return nil, fmt.Errorf("ask %v: %w after %d tries of %v", a.Server, errUnanswered, max(a.Tries, 1), a.Timeout)
}

// AskAll asks every query, cap(pool) at a time, and calls done for each
// (from several goroutines at once).
func (a *Asker) AskAll(queries [][]byte, done func(i int, reply []byte, err error)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < cap(a.pool); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				reply, err := a.Ask(queries[i])
				done(i, reply, err)
			}
		}()
	}
	for i := range queries {
		next <- i
	}
	close(next)
	wg.Wait()
}

// outageLog sets the level of the log lines that say an outage began and
// ended (a silent server, SOA polls without an answer): an overloaded
// server that drops queries has many short outages a minute, so only the
// first of a minute is a warning, and only its end is news; the others
// are debug lines.
type outageLog struct {
	warned time.Time // when an outage was last logged as a warning
	loud   bool      // the current one was
}

// began is the level of the line that says an outage began.
func (o *outageLog) began() slog.Level {
	if time.Since(o.warned) < time.Minute {
		o.loud = false
		return slog.LevelDebug
	}
	o.warned, o.loud = time.Now(), true
	return slog.LevelWarn
}

// ended is the level of the line that says the outage ended.
func (o *outageLog) ended() slog.Level {
	if o.loud {
		return slog.LevelInfo
	}
	return slog.LevelDebug
}

// silenceLogger is an Asker's Silence that logs when the server at addr
// goes silent and answers again (outageLog).
func silenceLogger(log *slog.Logger, addr netip.AddrPort, timeout time.Duration) func(bool) {
	var mu sync.Mutex
	var o outageLog
	return func(silent bool) {
		mu.Lock()
		defer mu.Unlock()
		if silent {
			log.Log(context.Background(), o.began(), "the server answered nothing for 3 tries of --timeout: asking it one question at a time until it answers; the others wait",
				"server", addr, "timeout", timeout)
		} else {
			log.Log(context.Background(), o.ended(), "the server answers again", "server", addr)
		}
	}
}
