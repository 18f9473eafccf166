package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/postbox-relay/postbox/cmd/postbox/internal/bench"
)

// cmdBench is `postbox bench`: flags into bench.Options, the figures out.
func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == bench.BareClientArg {
		// The floor scenarios' bare client, which a bench starts.
		if err := bench.ServeBareClient(ctx, os.Stdin, stdout); err != nil {
			fmt.Fprintln(stderr, "postbox bench:", err)
			return exitFailure
		}
		return exitOK
	}
	var o bench.Options
	var asJSON bool
	fs := flag.NewFlagSet("postbox bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Scenarios, "scenario", bench.ScenariosDefault, "comma-separated: latency, floor, hanging, failing, catchup, catchup-bulk, load, load-floor, chaos, soak, dead, scale, storm, partners")
	fs.IntVar(&o.Rate, "rate", 0, fmt.Sprintf("latency, chaos, soak: events per second (default %d, chaos %d)", bench.RateDefault, bench.ChaosRateDefault))
	fs.IntVar(&o.Endpoints, "endpoints", bench.EndpointsDefault, "number of endpoints")
	fs.DurationVar(&o.Duration, "duration", bench.DurationDefault, "latency, load, load-floor, chaos, soak: how long to produce")
	fs.DurationVar(&o.Warmup, "warmup", bench.WarmupDefault, "latency, hanging, floor: how long to produce before measuring (negative: no warm-up)")
	fs.IntVar(&o.Backlog, "backlog", bench.BacklogDefault, "catchup, catchup-bulk: events queued while the relay is down (catchup: one a transaction; catchup-bulk: 1,000 a transaction)")
	fs.IntVar(&o.Producers, "producers", bench.ProducersDefault, "load, load-floor: concurrent producers inserting as fast as they can; catchup: producers writing the backlog")
	fs.Uint64Var(&o.Seed, "seed", 0, "chaos: seed of the faults and their moments (default random, printed)")
	fs.StringVar(&o.Faults, "faults", "", "chaos: comma-separated faults to inject (default all: kill, freeze, restart-fast, restart-immediate, drop-slot, read-only)")
	fs.IntVar(&o.Relays, "relays", bench.ChaosRelays, "chaos: relays run against the one database")
	fs.IntVar(&o.Dead, "dead", bench.DeadDefault, "dead: endpoints with open breakers and deliveries waiting, beside the healthy ones")
	fs.IntVar(&o.Storm, "storm", bench.StormDefault, "storm: endpoints whose targets refuse connections, an event each before the run, beside the healthy ones")
	fs.IntVar(&o.StormRate, "storm-rate", bench.StormRateDefault, "storm: fresh events a second for the failing endpoints during the run")
	fs.IntVar(&o.Instances, "instances", bench.InstancesDefault, "scale: run 1, 2, … up to this many relays against the one database")
	fs.IntVar(&o.TableEndpoints, "table-endpoints", bench.TableEndpointsDefault, "partners: rows of postbox.endpoints to write, --endpoints of them receiving the latency run's events")
	fs.StringVar(&o.PartnersParts, "partners-parts", "", "partners: comma-separated parts to run: latency, start, caughtup (the first start waits until it has read the rows), follow (default all)")
	fs.BoolVar(&o.Emit, "emit", false, "latency, catchup, load, scale: write events with outbox.Emit (WAL messages) instead of outbox rows")
	fs.IntVar(&o.WalsenderNice, "walsender-nice", 0, "load, load-floor: give the walsender streaming the events this nice value, -20 to 19 (default: leave it); it must run on this machine")
	fs.StringVar(&o.CPUScheduling, "cpu-scheduling", "batch", "the relay's cpu_scheduling, batch or normal, and the floor's bare client's in its own process")
	fs.BoolVar(&o.FloorInProcess, "floor-in-process", false, "floor, load-floor: run the bare client in the bench's process, beside the receiver (a floor a little under any relay's; as before)")
	fs.StringVar(&o.RelayBinary, "relay-binary", "", "run this postbox binary as the relay (default this one): another build, measured by the same bench")
	fs.IntVar(&o.PG, "pg", 0, "run PostgreSQL of this major version, 14 to 18 (default: $POSTBOX_TEST_PG, or the system's); .ci/pg-install installs those the system lacks")
	fs.BoolVar(&asJSON, "json", false, "print one JSON document")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	// With a failed check (signatures, losses, latencies unmeasured,
	// duplicates over their bound) Run returns the figures and an error.
	res, err := bench.Run(ctx, o, stderr)
	if res != nil && asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(res); jerr != nil {
			fmt.Fprintln(stderr, "postbox bench: the figures as JSON:", jerr)
			if err == nil {
				return exitFailure
			}
		}
	} else if res != nil {
		res.Print(stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "postbox bench:", err)
		return exitFailure
	}
	return exitOK
}
