package bench

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/config"
)

// soakSeries is a 30-minute soak's samples, one every soakInterval, each
// figure f(t) of the time in seconds plus noise of up to ±noise.
func soakSeries(seed uint64, noise float64, rss, table, wal, dead func(t float64) float64) []SoakSample {
	r := rand.New(rand.NewPCG(seed, seed))
	jit := func() float64 { return noise * (2*r.Float64() - 1) }
	var ss []SoakSample
	for at := soakInterval; at <= 30*time.Minute; at += soakInterval {
		t := at.Seconds()
		ss = append(ss, SoakSample{AtSeconds: t, RSSMB: rss(t) + jit(), RetainedWALMB: wal(t) + jit(), DeadTuples: int64(dead(t) * (1 + jit()/100)),
			Relations: map[string]float64{"events": table(t) + jit(), "events indexes": table(t)/4 + jit()/4}})
	}
	return ss
}

// growing names the figures judged growing.
func growing(slopes []SoakSlope) []string {
	var names []string
	for _, s := range slopes {
		if s.Growing {
			names = append(names, s.Figure)
		}
	}
	return names
}

// thirdsGrew is the rule the soak judged by before: the last third's mean
// above 1.5× the middle third's.
func thirdsGrew(ss []SoakSample, f func(SoakSample) float64) bool {
	n := len(ss)
	mean := func(ss []SoakSample) float64 {
		sum := 0.0
		for _, s := range ss {
			sum += f(s)
		}
		return sum / float64(len(ss))
	}
	return mean(ss[2*n/3:]) > 1.5*mean(ss[n/3:2*n/3])
}

// TestSoakFitSlope: the fit finds an exact line's slope with no error, and
// a noisy line's within its interval.
func TestSoakFitSlope(t *testing.T) {
	t.Parallel()
	x, y := []float64{0, 1, 2, 3, 4}, []float64{2, 5, 8, 11, 14}
	slope, se := fitSlope(x, y)
	require.InDelta(t, 3, slope, 1e-9)
	require.InDelta(t, 0, se, 1e-9)

	r := rand.New(rand.NewPCG(1, 2))
	x, y = x[:0], y[:0]
	for i := range 200 {
		x = append(x, float64(i))
		y = append(y, 0.5*float64(i)+10+r.NormFloat64())
	}
	slope, se = fitSlope(x, y)
	require.InDelta(t, 0.5, slope, tQuantile975(len(x)-2)*se)
	require.Greater(t, se, 0.0)

	_, se = fitSlope([]float64{1, 1, 1}, []float64{1, 2, 3})
	require.Zero(t, se, "no spread in x")
	require.InDelta(t, 12.706, tQuantile975(1), 1e-9)
	require.InDelta(t, 1.96, tQuantile975(5000), 1e-9)
}

// TestSoakJudge: a flat noisy run and a sawtooth (purges each retention
// round, autovacuum, slot advances) are bounded; a moderate linear leak
// the thirds rule let through grows; too short a run is not judged.
func TestSoakJudge(t *testing.T) {
	t.Parallel()
	flat := func(v float64) func(float64) float64 { return func(float64) float64 { return v } }
	saw := func(base, amp, period float64) func(float64) float64 {
		return func(t float64) float64 { return base + amp*math.Mod(t, period)/period }
	}

	ss := soakSeries(1, 2, flat(40), flat(60), flat(30), flat(50000))
	slopes, judged := judgeSoak(ss, soakWarmUp.Seconds(), 200)
	require.True(t, judged)
	require.Empty(t, growing(slopes), "%+v", slopes)
	require.Len(t, slopes, 5, "RSS, WAL, dead tuples, the table and its indexes")
	require.Equal(t, len(ss)-int(soakWarmUp/soakInterval)+1, slopes[0].Samples, "judged from the warm-up on")

	ss = soakSeries(2, 1, saw(40, 3, 120), saw(60, 10, 60), saw(16, 48, 300), saw(0, 200000, 90))
	slopes, _ = judgeSoak(ss, soakWarmUp.Seconds(), 200)
	require.Empty(t, growing(slopes), "%+v", slopes)

	// 20 MB/h of RSS and 30 MB/h of a table: 40 → 50 MB and 60 → 75 MB
	// over 30 minutes, which the last third against the middle third
	// (×1.07) never saw.
	perHour := func(base, h float64) func(float64) float64 {
		return func(t float64) float64 { return base + h*t/3600 }
	}
	ss = soakSeries(3, 2, perHour(40, 20), perHour(60, 30), flat(30), flat(50000))
	require.False(t, thirdsGrew(ss, func(s SoakSample) float64 { return s.RSSMB }))
	require.False(t, thirdsGrew(ss, func(s SoakSample) float64 { return s.Relations["events"] }))
	slopes, _ = judgeSoak(ss, soakWarmUp.Seconds(), 200)
	require.ElementsMatch(t, []string{"relay RSS", "postbox.events"}, growing(slopes), "%+v", slopes)
	for _, s := range slopes {
		if s.Figure == "relay RSS" {
			require.InDelta(t, 20, s.PerHour, s.CI95)
		}
	}
	res := &SoakResult{Slopes: slopes}
	require.ErrorIs(t, res.err(), ErrUnbounded)
	require.NoError(t, (&SoakResult{}).err())

	// The table thresholds scale with the rate: 30 MB/h at 1,000 events/s
	// is within 50 MB/h.
	slopes, _ = judgeSoak(ss, soakWarmUp.Seconds(), 1000)
	require.Equal(t, []string{"relay RSS"}, growing(slopes))

	_, judged = judgeSoak(ss[:int(soakWarmUp/soakInterval)+soakMinJudged-2], soakWarmUp.Seconds(), 200)
	require.False(t, judged)
}

// TestSoakConfig: the soak's relay keeps everything soakRetention.
func TestSoakConfig(t *testing.T) {
	t.Parallel()
	secret := outbox.NewSecret()
	e := &env{dbURL: "postgres://bench@localhost/bench", slot: "postbox", secret: secret, recv: newReceiver(secret)}
	defer e.recv.Close()
	cfg, err := config.Parse([]byte(e.soakConfig(2)))
	require.NoError(t, err)
	for _, d := range []time.Duration{cfg.OutboxRetention, cfg.EventRetention, cfg.DeliveryRetention, cfg.AttemptRetention} {
		require.Equal(t, soakRetention, d)
	}
}
