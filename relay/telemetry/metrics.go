package telemetry

import (
	"sort"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// OtherEndpoint is the endpoint label of every endpoint past the cap.
const OtherEndpoint = "other"

// Metrics are postbox's Prometheus metrics, on their own registry.
type Metrics struct {
	Registry *prometheus.Registry

	deliveries       *prometheus.CounterVec
	deadLetters      *prometheus.CounterVec
	attemptDuration  *prometheus.HistogramVec
	commitToDelivery *prometheus.HistogramVec
	streamToAttempt  prometheus.Histogram
	commitToStream   prometheus.Histogram
	commitToSend     prometheus.Histogram
	ingested         prometheus.Counter
	messagesRefused  prometheus.Counter
	queueDepth       *prometheus.GaugeVec
	oldestPending    prometheus.Gauge
	breaker          *prometheus.GaugeVec
	endpointLatency  *prometheus.GaugeVec
	slotLag          prometheus.Gauge
	alerts           *prometheus.GaugeVec
	streaming        prometheus.Gauge
	walsender        *walsenderCollector

	labeled atomic.Pointer[map[string]bool]
}

// NewMetrics registers the metrics.
func NewMetrics() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	latencyBuckets := []float64{.001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10, 15, 30, 60}
	// From sub-millisecond (a live stream: the commit's WAL flush is a few
	// tenths of a millisecond, so the first millisecond is split finely)
	// to minutes (a backlog).
	streamBuckets := []float64{.0002, .0003, .0004, .0005, .0006, .0008, .001, .0015, .002, .003, .005, .01, .02, .05, .1,
		.2, .5, 1, 5, 30, 60, 300}
	m := &Metrics{
		Registry: reg,
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_deliveries_total",
			Help: "Recorded delivery outcomes: delivered, failed (a retry is scheduled), dead_letter, released (back to the queue unattempted).",
		}, []string{"endpoint", "outcome"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_dead_letters_total",
			Help: "Deliveries given up and dead-lettered.",
		}, []string{"endpoint"}),
		attemptDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "postbox_attempt_duration_seconds",
			Help:    "Duration of HTTP delivery attempts, from sending to the end of the response.",
			Buckets: latencyBuckets,
		}, []string{"endpoint"}),
		commitToDelivery: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "postbox_commit_to_delivery_seconds",
			Help:    "Time from the outbox transaction's commit to the successful delivery.",
			Buckets: latencyBuckets,
		}, []string{"endpoint"}),
		streamToAttempt: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "postbox_stream_to_attempt_seconds",
			Help: "postbox's own share of a first attempt's latency: from the stream's receipt of the committed row " +
				"to the request's hand-over to the HTTP client, for first attempts started from the stream.",
			Buckets: []float64{.00005, .0001, .0002, .0005, .001, .002, .005, .01, .02, .05, .1, .5},
		}),
		commitToStream: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "postbox_commit_to_stream_seconds",
			Help: "Time from an outbox transaction's commit to postbox's receipt of it from the replication stream: " +
				"the database's share of the latency while postbox keeps up, the stream's backlog while it catches up.",
			Buckets: streamBuckets,
		}),
		commitToSend: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "postbox_commit_to_send_seconds",
			Help: "Time from an outbox transaction's commit to the server's sending of it on the replication stream, " +
				"both on the server's clock: the server's share of postbox_commit_to_stream_seconds (the commit's WAL " +
				"flush, the walsender's turn and its decoding).",
			Buckets: streamBuckets,
		}),
		ingested: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postbox_ingested_events_total",
			Help: "Outbox events ingested from the stream or by reconciliation.",
		}),
		messagesRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postbox_messages_refused_total",
			Help: "Events written with outbox.Emit dead-lettered unattempted (messages_off) because outbox_messages is off.",
		}),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "postbox_queue_depth",
			Help: "Deliveries by status: pending, awaiting_retry, in_flight, dead_letter.",
		}, []string{"status"}),
		oldestPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "postbox_oldest_pending_age_seconds",
			Help: "Age of the oldest undelivered event (0 when none).",
		}),
		breaker: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "postbox_circuit_breaker_state",
			Help: "Circuit breaker per endpoint: 0 closed, 1 half-open, 2 open.",
		}, []string{"endpoint"}),
		endpointLatency: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "postbox_endpoint_latency_seconds",
			Help: "Attempt latency percentiles per endpoint over the rolling 24 hours.",
		}, []string{"endpoint", "quantile"}),
		slotLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "postbox_replication_slot_lag_bytes",
			Help: "WAL retained by the replication slot.",
		}),
		alerts: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "postbox_alert_firing",
			Help: "1 while an alert fires: dead_letters_rising, oldest_pending, endpoint_latency, slot_lag, database_fault, messages_off, endpoint_invalid.",
		}, []string{"alert", "endpoint"}),
		streaming: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "postbox_streaming",
			Help: "1 while this instance streams the replication slot.",
		}),
		walsender: newWalsenderCollector(),
	}
	reg.MustRegister(m.deliveries, m.deadLetters, m.attemptDuration, m.commitToDelivery, m.streamToAttempt, m.commitToStream, m.commitToSend, m.ingested, m.messagesRefused, m.queueDepth,
		m.oldestPending, m.breaker, m.endpointLatency, m.slotLag, m.alerts, m.streaming, m.walsender)
	m.SetLabeled(nil, 0)
	return m
}

// SetLabeled chooses the endpoints with their own label: the first max
// of configured, by name. Every other endpoint is "other".
func (m *Metrics) SetLabeled(configured []string, limit int) {
	names := append([]string(nil), configured...)
	sort.Strings(names)
	set := map[string]bool{}
	for i, n := range names {
		if i >= limit {
			break
		}
		set[n] = true
	}
	m.labeled.Store(&set)
}

// Label is the endpoint label for name.
func (m *Metrics) Label(name string) string {
	if (*m.labeled.Load())[name] {
		return name
	}
	return OtherEndpoint
}

// Ingested counts ingested events.
func (m *Metrics) Ingested(n int) { m.ingested.Add(float64(n)) }

// MessagesRefused counts events written with outbox.Emit that were
// dead-lettered because outbox_messages is off.
func (m *Metrics) MessagesRefused(n int) { m.messagesRefused.Add(float64(n)) }

// Streamed observes how long after its commit a transaction was sent by
// the server (sent, on its clock; not observed when zero) and reached
// postbox (received: 0 when the clocks of the two hosts disagree the
// other way).
func (m *Metrics) Streamed(sent, received time.Duration) {
	if sent != 0 {
		m.commitToSend.Observe(max(sent, 0).Seconds())
	}
	m.commitToStream.Observe(max(received, 0).Seconds())
}

// Streaming sets whether this instance streams.
func (m *Metrics) Streaming(on bool) {
	if on {
		m.streaming.Set(1)
	} else {
		m.streaming.Set(0)
	}
}

// Outcome is what the metrics count of one recorded delivery outcome.
type Outcome struct {
	Endpoint string
	// Status is delivered, failed, dead_letter or released (back to the
	// queue unattempted).
	Status postboxtype.DeliveryState
	// Sampled is true when a request was sent; ResponseMS is then its
	// duration.
	Sampled    bool
	ResponseMS float64
	// CommitToDeliveryMS is from the event's commit to its delivery (-1
	// when unknown).
	CommitToDeliveryMS float64
	// StreamToAttempt is postbox's own share of a first attempt started
	// from the stream (0 for other attempts).
	StreamToAttempt time.Duration
}

// Recorded counts a recorded outcome.
func (m *Metrics) Recorded(r Outcome) {
	ep := m.Label(r.Endpoint)
	m.deliveries.WithLabelValues(ep, r.Status.String()).Inc()
	if r.Sampled {
		m.attemptDuration.WithLabelValues(ep).Observe(r.ResponseMS / 1000)
	}
	if r.StreamToAttempt > 0 {
		m.streamToAttempt.Observe(r.StreamToAttempt.Seconds())
	}
	switch r.Status {
	case postboxtype.DeliveryDelivered:
		if r.CommitToDeliveryMS >= 0 {
			m.commitToDelivery.WithLabelValues(ep).Observe(r.CommitToDeliveryMS / 1000)
		}
	case postboxtype.DeliveryDeadLetter:
		m.deadLetters.WithLabelValues(ep).Inc()
	}
}

// Observe sets the gauges from a summary, the endpoints' stats and the
// alerts.
func (m *Metrics) Observe(s Summary, endpoints []EndpointStats, alerts []Alert) {
	m.queueDepth.WithLabelValues("pending").Set(float64(s.Pending))
	m.queueDepth.WithLabelValues("awaiting_retry").Set(float64(s.AwaitingRetry))
	m.queueDepth.WithLabelValues("in_flight").Set(float64(s.InFlight))
	m.queueDepth.WithLabelValues("dead_letter").Set(float64(s.DeadLetter))
	if s.OldestPendingAgeSeconds != nil {
		m.oldestPending.Set(*s.OldestPendingAgeSeconds)
	} else {
		m.oldestPending.Set(0)
	}
	m.slotLag.Set(float64(s.Slot.RetainedBytes))
	m.breaker.Reset()
	m.endpointLatency.Reset()
	for _, e := range endpoints {
		label := m.Label(e.Endpoint)
		if label == OtherEndpoint {
			continue // per-endpoint gauges only for labelled endpoints
		}
		m.breaker.WithLabelValues(label).Set(map[postboxtype.BreakerState]float64{postboxtype.BreakerHalfOpen: 1, postboxtype.BreakerOpen: 2}[e.State])
		for q, v := range map[string]*float64{"0.5": e.P50MS, "0.95": e.P95MS, "0.99": e.P99MS} {
			if v != nil {
				m.endpointLatency.WithLabelValues(label, q).Set(*v / 1000)
			}
		}
	}
	m.alerts.Reset()
	type key struct{ alert, endpoint string }
	firing := map[key]float64{}
	for _, a := range alerts {
		k := key{a.Name, ""}
		if a.Subject != "" {
			k.endpoint = m.Label(a.Subject)
		}
		if a.Firing {
			firing[k] = 1
		} else if _, ok := firing[k]; !ok {
			firing[k] = 0
		}
	}
	for k, v := range firing {
		m.alerts.WithLabelValues(k.alert, k.endpoint).Set(v)
	}
}
