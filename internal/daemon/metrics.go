package daemon

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/internal/dataplane"
)

// metrics are santad's Prometheus metrics. Data-plane numbers are read from
// the per-CPU maps at scrape time.
type metrics struct {
	d              *Daemon
	reg            *prometheus.Registry
	requests       *prometheus.CounterVec
	errors         *prometheus.CounterVec
	samplesDropped prometheus.Counter
	expired        prometheus.Counter
	srv            *http.Server

	events, ruleHits, ruleBytes, socketHits, socketBytes, socketRules, rules, sockets, dataBytes, maxRules, maxData, idleClosed *prometheus.Desc
}

func newMetrics(d *Daemon) *metrics {
	m := &metrics{
		d:   d,
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "santa_api_requests_total",
			Help: "Control API requests by op and status."}, []string{"op", "status"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "santa_api_errors_total",
			Help: "Control API requests refused, by op and status."}, []string{"op", "status"}),
		samplesDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "santa_miss_samples_dropped_total",
			Help: "Miss samples not delivered because a subscriber fell behind."}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{Name: "santa_rules_expired_total",
			Help: "Rules santad removed because their expires time came."}),
		events: prometheus.NewDesc("santa_dataplane_events_total",
			"Rule processor outcomes: answered, every pass reason, miss sampling, and the TCP path's tcp_* events "+
				"(socket-less answers, hand-offs and passes to the kernel: docs/tcp.md) (see bpf/santa.h).", []string{"event"}, nil),
		ruleHits: prometheus.NewDesc("santa_rule_hits_total", "Requests answered by a rule.", []string{"socket", "rule"}, nil),
		ruleBytes: prometheus.NewDesc("santa_rule_reply_bytes_total", "Reply frame bytes sent by a rule.",
			[]string{"socket", "rule"}, nil),
		socketHits: prometheus.NewDesc("santa_socket_hits_total", "Requests answered by a socket's rules.", []string{"socket", "owner", "address"}, nil),
		socketBytes: prometheus.NewDesc("santa_socket_reply_bytes_total", "Reply frame bytes sent by a socket's rules.",
			[]string{"socket", "owner", "address"}, nil),
		socketRules: prometheus.NewDesc("santa_socket_rules", "Rules of a socket.", []string{"socket", "owner", "address"}, nil),
		rules:       prometheus.NewDesc("santa_rules", "Rules installed.", nil, nil),
		sockets:     prometheus.NewDesc("santa_sockets", "Sockets with rule sets.", nil, nil),
		dataBytes:   prometheus.NewDesc("santa_rule_data_bytes", "Bytes of patterns, masks and templates in use.", nil, nil),
		maxRules:    prometheus.NewDesc("santa_rule_capacity", "Rules the data plane can hold.", nil, nil),
		maxData:     prometheus.NewDesc("santa_rule_data_capacity_bytes", "Bytes of patterns, masks and templates the data plane can hold.", nil, nil),
		idleClosed: prometheus.NewDesc("santa_tcp_idle_closed_total",
			"Socket-less TCP connections closed with eBPF's FIN after dataplane.tcp_idle_close without a request, since santad started.", nil, nil),
	}
	m.reg.MustRegister(m.requests, m.errors, m.samplesDropped, m.expired, m, prometheus.NewGoCollector())
	return m
}

func (m *metrics) request(op api.Op, status api.Status) {
	label := op.String()
	if !op.Known() {
		label = "unknown" // one series for them all: clients choose the op number
	}
	m.requests.WithLabelValues(label, status.String()).Inc()
	if status != api.StatusOK {
		m.errors.WithLabelValues(label, status.String()).Inc()
	}
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.events, m.ruleHits, m.ruleBytes, m.socketHits, m.socketBytes, m.socketRules,
		m.rules, m.sockets, m.dataBytes, m.maxRules, m.maxData, m.idleClosed} {
		ch <- d
	}
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	d := m.d
	// as a request: a scrape of many rules may outlast the server's
	// shutdown, and must not read the data plane once Close has begun
	d.requests.RLock()
	defer d.requests.RUnlock()
	if d.stopping {
		return
	}
	if c, err := d.dp.Counters(); err == nil {
		for name, v := range dataplane.CounterNames(c) {
			ch <- prometheus.MustNewConstMetric(m.events, prometheus.CounterValue, float64(v), name)
		}
	}
	ch <- prometheus.MustNewConstMetric(m.idleClosed, prometheus.CounterValue, float64(d.dp.IdleClosed()))
	u := d.dp.Usage()
	gauge := func(desc *prometheus.Desc, v int) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, float64(v))
	}
	gauge(m.rules, u.Rules)
	gauge(m.sockets, u.Rulesets)
	gauge(m.dataBytes, u.DataBytes)
	gauge(m.maxRules, d.dp.Config().MaxRules)
	gauge(m.maxData, u.MaxDataBytes)
	perRule := u.Rules <= d.cfg.MetricsRuleLimit
	// santad's lock only for the list of sockets: reading the counters of
	// a million rules takes about 0.4 s, which would hold up every request
	type socket struct {
		cookie            uint64
		sock, owner, addr string
		rules             int
	}
	d.mu.Lock()
	socks := make([]socket, 0, len(d.sets))
	for cookie, rs := range d.sets {
		socks = append(socks, socket{cookie, strconv.FormatUint(cookie, 10), strconv.FormatUint(uint64(rs.info.Owner), 10),
			rs.info.AddrPort().String(), len(rs.rules)})
	}
	d.mu.Unlock()
	for _, s := range socks {
		stats, gone, err := d.dp.SocketStats(s.cookie)
		if err != nil {
			continue // unbound meanwhile
		}
		if perRule {
			for id, st := range stats {
				rule := strconv.FormatUint(uint64(id), 10)
				ch <- prometheus.MustNewConstMetric(m.ruleHits, prometheus.CounterValue, float64(st.Hits), s.sock, rule)
				ch <- prometheus.MustNewConstMetric(m.ruleBytes, prometheus.CounterValue, float64(st.Bytes), s.sock, rule)
			}
		}
		total := dataplane.Total(stats, gone) // counters: what rules since gone counted stays in
		ch <- prometheus.MustNewConstMetric(m.socketHits, prometheus.CounterValue, float64(total.Hits), s.sock, s.owner, s.addr)
		ch <- prometheus.MustNewConstMetric(m.socketBytes, prometheus.CounterValue, float64(total.Bytes), s.sock, s.owner, s.addr)
		ch <- prometheus.MustNewConstMetric(m.socketRules, prometheus.GaugeValue, float64(s.rules), s.sock, s.owner, s.addr)
	}
}

// serve exposes /metrics on l.
func (m *metrics) serve(l net.Listener) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := m.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.d.log.Error("metrics server failed", "error", err)
		}
	}()
}

func (m *metrics) close() {
	if m.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		m.srv.Shutdown(ctx)
	}
}
