package daemon

import (
	"errors"
	"io"
	"os"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/internal/dataplane"
)

// subscriber receives one socket's miss samples for one connection.
type subscriber struct {
	cookie  uint64
	seq     uint64
	opts    dataplane.SampleOptions // what it asked for
	samples chan dataplane.MissSample
	done    chan struct{}
}

func (s *subscriber) close() {
	if !isClosed(s.done) {
		close(s.done)
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// event is the message that carries sample m to the subscriber.
func (s *subscriber) event(m dataplane.MissSample) *api.Message {
	return &api.Message{V: api.Version, Op: api.OpSample, Seq: s.seq, Socket: m.Cookie,
		Sample: m.Payload, RequestLen: uint32(m.Len)}
}

// subscribe sets the socket's sampling for as long as the connection stays.
func (s *session) subscribe(req *api.Message, files []*os.File) (*subscriber, error) {
	d := s.d
	if req.SampleBytes == 0 || req.SampleRate == 0 {
		return nil, fail(api.StatusInvalid, "subscribe needs sample_bytes (1 to %d) and sample_rate (samples per second and CPU)", dataplane.MaxSample)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	rs, _, err := s.target(req, files, false)
	if err != nil {
		return nil, err
	}
	opts := dataplane.SampleOptions{Bytes: int(req.SampleBytes), PerSecond: int(req.SampleRate)}
	sub := &subscriber{cookie: rs.info.Cookie, seq: req.Seq, opts: opts,
		samples: make(chan dataplane.MissSample, 1024), done: make(chan struct{})}
	d.subMu.Lock()
	defer d.subMu.Unlock()
	if err := d.dp.SetSampling(sub.cookie, d.widestSamplingLocked(sub.cookie, opts)); err != nil {
		return nil, fail(api.StatusInvalid, "%v", err)
	}
	if d.subs[sub.cookie] == nil {
		d.subs[sub.cookie] = map[*subscriber]struct{}{}
	}
	d.subs[sub.cookie][sub] = struct{}{}
	return sub, nil
}

// widestSamplingLocked is opts widened to what every subscriber of the
// socket asked for (the most bytes, the highest rate): a subscriber that
// only watches the socket does not thin out another's samples. Callers
// hold d.subMu.
func (d *Daemon) widestSamplingLocked(cookie uint64, opts dataplane.SampleOptions) dataplane.SampleOptions {
	for other := range d.subs[cookie] {
		opts.Bytes = max(opts.Bytes, other.opts.Bytes)
		opts.PerSecond = max(opts.PerSecond, other.opts.PerSecond)
	}
	return opts
}

// sampleWriteTimeout bounds a write of samples to a subscriber: one that
// reads none for that long (its socket buffer full) loses its stream, so
// that it holds neither a goroutine nor its queue of samples for good.
const sampleWriteTimeout = 10 * time.Second

// stream sends samples until the client hangs up, the socket's rule set
// goes away, santad stops or a write times out (sampleWriteTimeout); then
// the socket's own sampling is restored.
func (s *session) stream(sub *subscriber) {
	d := s.d
	hangup := make(chan struct{})
	go func() { // the client sends nothing more: a read returns when it hangs up
		var b [1]byte
		s.conn.Unix().Read(b[:])
		close(hangup)
	}()
	ended := make(chan struct{})
	defer close(ended)
	go func() {
		select {
		case <-sub.done: // end a write the client does not read now
			s.conn.Unix().SetWriteDeadline(time.Now())
		case <-ended:
		}
	}()
	defer d.unsubscribe(sub)
	var batch []*api.Message
	for {
		select {
		case m := <-sub.samples:
			// samples come in bursts (MissSamples.Read): one write for
			// those already queued wakes the client once
			batch = append(batch[:0], sub.event(m))
			for queued := len(sub.samples); queued > 0; queued-- {
				batch = append(batch, sub.event(<-sub.samples))
			}
			s.conn.Unix().SetWriteDeadline(time.Now().Add(sampleWriteTimeout))
			if isClosed(sub.done) { // before this deadline replaced the one that ends the write
				return
			}
			if err := s.conn.SendAll(batch); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) && !isClosed(sub.done) {
					d.log.Warn("subscriber read no samples for "+sampleWriteTimeout.String()+": its stream is ended",
						"uid", s.uid, "pid", s.pid, "socket", sub.cookie)
				}
				return
			}
		case <-hangup:
			return
		case <-sub.done:
			return
		}
	}
}

// unsubscribe narrows the socket's sampling to what the remaining
// subscribers ask for, or restores the socket's own after the last. After
// santad stopped (a stream ends when Close ends its subscription) the data
// plane is closed: the next santad binds each socket with its own sampling.
func (d *Daemon) unsubscribe(sub *subscriber) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.subMu.Lock()
	defer d.subMu.Unlock()
	delete(d.subs[sub.cookie], sub)
	rs, ok := d.sets[sub.cookie]
	switch {
	case d.closed:
	case len(d.subs[sub.cookie]) == 0:
		delete(d.subs, sub.cookie)
		if ok {
			d.dp.SetSampling(sub.cookie, rs.sample)
		}
	case ok:
		d.dp.SetSampling(sub.cookie, d.widestSamplingLocked(sub.cookie, dataplane.SampleOptions{}))
	}
}

// closeSubscribers ends the subscriptions of a socket whose rule set is gone.
func (d *Daemon) closeSubscribers(cookie uint64) {
	d.subMu.Lock()
	defer d.subMu.Unlock()
	d.closeSubscribersLocked(cookie)
}

func (d *Daemon) closeSubscribersLocked(cookie uint64) {
	for sub := range d.subs[cookie] {
		sub.close()
	}
}

// dispatchSamples hands each miss sample to its socket's subscribers; a
// subscriber that cannot keep up loses samples, counted in metrics.
func (d *Daemon) dispatchSamples() {
	defer d.wg.Done()
	for {
		m, err := d.samples.Read()
		if err != nil {
			if !errors.Is(err, dataplane.ErrClosed) {
				d.log.Error("reading miss samples failed", "error", err)
			}
			return
		}
		d.subMu.Lock()
		for sub := range d.subs[m.Cookie] {
			select {
			case sub.samples <- m:
			default:
				d.metrics.samplesDropped.Inc()
			}
		}
		d.subMu.Unlock()
	}
}

// watchReleased frees the rules of sockets the kernel reports closed. The
// release hook already stopped their rules from matching.
func (d *Daemon) watchReleased() {
	defer d.wg.Done()
	for {
		cookie, err := d.released.Read()
		if err != nil {
			if !errors.Is(err, dataplane.ErrClosed) && !errors.Is(err, io.EOF) {
				d.log.Error("reading released sockets failed", "error", err)
			}
			return
		}
		d.mu.Lock()
		if rs, ok := d.sets[cookie]; ok {
			if err := d.unbind(rs); err != nil {
				d.log.Error("freeing the rules of a closed socket failed", "socket", cookie, "error", err)
			} else {
				d.log.Info("socket closed: its rules are gone", "socket", cookie, "owner", rs.info.Owner, "rules", len(rs.rules))
			}
		}
		d.mu.Unlock()
	}
}
