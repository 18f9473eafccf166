package main

import (
	"os"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFloorPercentPacesCollectionsUpToTheFloor(t *testing.T) {
	const mib = 1 << 20
	require.Equal(t, 700, floorPercent(32*mib, 4*mib, 100*mib), "4 MiB live, allocating fast: collect at 32 MiB")
	require.Equal(t, 160, floorPercent(32*mib, 12*mib, 100*mib), "rounded down to a step of 10")
	require.Equal(t, 200, floorPercent(32*mib, 4*mib, 8*mib), "the heap grows by what is allocated in a pace")
	require.Equal(t, 100, floorPercent(32*mib, 4*mib, mib), "allocating slowly: Go's default")
	require.Equal(t, 100, floorPercent(32*mib, 16*mib, 100*mib), "twice the live heap reaches the floor")
	require.Equal(t, 100, floorPercent(32*mib, 100*mib, 100*mib), "above the floor: Go's default")
	require.Equal(t, heapFloorMaxPercent, floorPercent(32*mib, mib/4, 100*mib), "bounded")
	require.Equal(t, heapFloorMaxPercent, floorPercent(32*mib, 0, 100*mib))
}

func TestHeapFloorRaisesGOGCAfterACollectionAndRestoresIt(t *testing.T) {
	t.Setenv("GOGC", "") // registers the variable's restore
	require.NoError(t, os.Unsetenv("GOGC"))
	if _, set := os.LookupEnv("GOMEMLIMIT"); set {
		t.Skip("GOMEMLIMIT is set in the test's environment")
	}
	h := startHeapFloor(1 << 40) // far above any live heap: the bound applies
	require.NotNil(t, h)
	stop := make(chan struct{})
	defer close(stop)
	go allocate(stop)
	require.Eventually(t, func() bool { return gcPercent() == heapFloorMaxPercent }, 10*time.Second, heapFloorEvery/4)
	h.Stop()
	require.Equal(t, 100, gcPercent(), "Stop puts the default back")

	t.Setenv("GOGC", "100")
	require.Nil(t, startHeapFloor(1<<40), "GOGC set: the operator decides")
}

// allocate allocates fast, as a catch-up does, and collects now and then,
// until stop closes.
func allocate(stop <-chan struct{}) {
	var keep [][]byte
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		keep = append(keep, make([]byte, 64<<10))
		if len(keep) == 256 {
			keep = nil
			runtime.GC()
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// gcPercent reads GOGC's current value.
func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}
