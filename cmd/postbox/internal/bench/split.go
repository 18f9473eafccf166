package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The relay's histograms that split a first attempt's latency at the
// stream's receipt of the row.
const (
	commitToStreamMetric  = "postbox_commit_to_stream_seconds"
	commitToSendMetric    = "postbox_commit_to_send_seconds"
	streamToAttemptMetric = "postbox_stream_to_attempt_seconds"
)

// Split is where a scenario's commit → receiver latency went before the
// request left, by the relay's own histograms, read from its /metrics at
// the scenario's start and end: from the commit to the stream's receipt of
// the row (the database's share: the walsender decoding it and sending
// it), and from there to the first attempt's hand-over to the HTTP client
// (the relay's share). The histograms' buckets bound the quantiles, so
// each is "at most". Only first attempts started from the stream count
// in the second.
// The floor's Split is the bare client's own exact timings instead.
type Split struct {
	Streamed            int     `json:"streamed"`
	CommitToStreamP50ms float64 `json:"commit_to_stream_p50_ms_at_most"`
	CommitToStreamP99ms float64 `json:"commit_to_stream_p99_ms_at_most"`
	// StreamedOver50ms is the share of rows the stream received more than
	// 50 ms after their commit.
	StreamedOver50ms float64 `json:"commit_to_stream_over_50ms_share"`
	// CommitToSend is the server's share of CommitToStream: from the
	// commit to the walsender's sending of it (both on the server's
	// clock); zero for a relay without that histogram.
	CommitToSendP50ms    float64 `json:"commit_to_send_p50_ms_at_most"`
	CommitToSendP99ms    float64 `json:"commit_to_send_p99_ms_at_most"`
	SentOver50ms         float64 `json:"commit_to_send_over_50ms_share"`
	StreamToAttemptP50ms float64 `json:"stream_to_attempt_p50_ms_at_most"`
	StreamToAttemptP99ms float64 `json:"stream_to_attempt_p99_ms_at_most"`
}

// MarshalJSON writes a quantile above the histograms' last bound (+Inf,
// for which JSON has no number) as null; encoding/json refused the whole
// document for it, and --json printed nothing.
func (s Split) MarshalJSON() ([]byte, error) {
	type plain Split
	v := reflect.ValueOf(plain(s))
	out := make(map[string]any, v.NumField())
	for i := range v.NumField() {
		f := v.Field(i).Interface()
		if x, ok := f.(float64); ok && math.IsInf(x, 0) {
			f = nil
		}
		out[v.Type().Field(i).Tag.Get("json")] = f
	}
	return json.Marshal(out)
}

// histograms are the relay's two split histograms at one moment.
type histograms map[string]*dto.Histogram

// scrapeSplit reads the split histograms from the relay's /metrics at
// addr; nil when it cannot (no address, the relay not answering).
func scrapeSplit(ctx context.Context, addr string) histograms {
	if addr == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil
	}
	out := histograms{}
	for _, name := range []string{commitToStreamMetric, commitToSendMetric, streamToAttemptMetric} {
		if f := fams[name]; f != nil && len(f.GetMetric()) == 1 {
			out[name] = f.GetMetric()[0].GetHistogram()
		}
	}
	return out
}

// splitBetween is the Split of what the histograms counted between from
// and to; nil without both readings.
func splitBetween(from, to histograms) *Split {
	if from == nil || to == nil {
		return nil
	}
	stream := bucketsBetween(from[commitToStreamMetric], to[commitToStreamMetric])
	send := bucketsBetween(from[commitToSendMetric], to[commitToSendMetric])
	attempt := bucketsBetween(from[streamToAttemptMetric], to[streamToAttemptMetric])
	if stream.total() == 0 {
		return nil
	}
	return &Split{
		Streamed:             int(stream.total()),
		CommitToStreamP50ms:  stream.quantileMS(0.50),
		CommitToStreamP99ms:  stream.quantileMS(0.99),
		StreamedOver50ms:     stream.over(0.050),
		CommitToSendP50ms:    send.quantileMS(0.50),
		CommitToSendP99ms:    send.quantileMS(0.99),
		SentOver50ms:         send.over(0.050),
		StreamToAttemptP50ms: attempt.quantileMS(0.50),
		StreamToAttemptP99ms: attempt.quantileMS(0.99),
	}
}

// buckets are a histogram's cumulative counts by upper bound (seconds),
// the last one +Inf.
type buckets struct {
	bounds []float64
	counts []uint64
}

// bucketsBetween is what the histogram counted between two readings.
func bucketsBetween(from, to *dto.Histogram) buckets {
	var b buckets
	if to == nil {
		return b
	}
	before := map[float64]uint64{}
	if from != nil {
		for _, bk := range from.GetBucket() {
			before[bk.GetUpperBound()] = bk.GetCumulativeCount()
		}
	}
	for _, bk := range to.GetBucket() {
		b.bounds = append(b.bounds, bk.GetUpperBound())
		b.counts = append(b.counts, bk.GetCumulativeCount()-before[bk.GetUpperBound()])
	}
	var prior uint64
	if from != nil {
		prior = from.GetSampleCount()
	}
	b.bounds = append(b.bounds, math.Inf(1))
	b.counts = append(b.counts, to.GetSampleCount()-prior)
	return b
}

func (b buckets) total() uint64 {
	if len(b.counts) == 0 {
		return 0
	}
	return b.counts[len(b.counts)-1]
}

// quantileMS is the upper bound (ms) of the bucket that holds quantile q;
// +Inf when it is above the last bound, 0 without observations.
func (b buckets) quantileMS(q float64) float64 {
	n := b.total()
	if n == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(n)))
	for i, c := range b.counts {
		if c >= want {
			return b.bounds[i] * 1000
		}
	}
	return math.Inf(1)
}

// over is the share of observations above bound (seconds), which must be
// one of the buckets' bounds.
func (b buckets) over(bound float64) float64 {
	n := b.total()
	for i, ub := range b.bounds {
		if ub == bound && n > 0 {
			return float64(n-b.counts[i]) / float64(n)
		}
	}
	return 0
}

// print writes the split, if the scenario has one: a relay's, whose
// quantiles are its histograms' bucket bounds.
func (s *Split) print(w io.Writer) {
	if s == nil {
		return
	}
	sent := ""
	if s.CommitToSendP50ms > 0 {
		sent = fmt.Sprintf(" (the server's send p50 ≤ %s, p99 ≤ %s, %.1f%% over 50 ms)", msBound(s.CommitToSendP50ms), msBound(s.CommitToSendP99ms), 100*s.SentOver50ms)
	}
	fmt.Fprintf(w, "  before the request (the relay's histograms, bucket bounds): commit → stream p50 ≤ %s, p99 ≤ %s (%.1f%% over 50 ms)%s; stream → attempt p50 ≤ %s, p99 ≤ %s\n",
		msBound(s.CommitToStreamP50ms), msBound(s.CommitToStreamP99ms), 100*s.StreamedOver50ms, sent, msBound(s.StreamToAttemptP50ms), msBound(s.StreamToAttemptP99ms))
}

// printExact writes the floor's split, whose quantiles are the bare
// client's own timings.
func (s *Split) printExact(w io.Writer) {
	if s == nil {
		return
	}
	fmt.Fprintf(w, "  before the request (the bare client's timings): commit → stream p50 %.2f ms, p99 %.2f ms (%.1f%% over 50 ms) (the server's send p50 %.2f ms, p99 %.2f ms, %.1f%% over 50 ms); stream → request p50 %.2f ms, p99 %.2f ms\n",
		s.CommitToStreamP50ms, s.CommitToStreamP99ms, 100*s.StreamedOver50ms, s.CommitToSendP50ms, s.CommitToSendP99ms, 100*s.SentOver50ms, s.StreamToAttemptP50ms, s.StreamToAttemptP99ms)
}

func msBound(ms float64) string {
	if math.IsInf(ms, 1) {
		return "∞"
	}
	return fmt.Sprintf("%g ms", ms)
}
