package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/postbox-relay/postbox/internal/proc"
)

// BareClientArg, as the first argument of `postbox bench`, makes the
// process the floor scenarios' bare logical client (ServeBareClient)
// instead of a bench: the bench starts it so, as a process of its own.
const BareClientArg = "--serve-bare-client"

// bareClient is what the floor scenarios need of the bare logical client:
// a forwarder in this process, or one in a process of its own.
type bareClient interface {
	// forgetTimings drops the timings taken so far (a warm-up's).
	forgetTimings() error
	// stop ends the stream, waits for the requests in flight and returns
	// the commit time of every event seen.
	stop() (map[string]time.Time, error)
	// split is the client's exact timings; call it after stop.
	split() *Split
}

// bareClientSetup is what the bench tells a bare client process first.
type bareClientSetup struct {
	DBURL  string `json:"db_url"`
	Slot   string `json:"slot"`
	Target string `json:"target"`
	Secret string `json:"secret"`
	// Batch schedules its threads as postbox's cpu_scheduling: batch does.
	Batch bool `json:"batch"`
}

// bareClientReply is each line a bare client process answers with: to
// the setup, to "forget" and, with its figures, to "stop".
type bareClientReply struct {
	Error     string               `json:"error,omitempty"`
	Committed map[string]time.Time `json:"committed,omitempty"`
	ToSend    []float64            `json:"to_send,omitempty"`
	ToStream  []float64            `json:"to_stream,omitempty"`
	ToPost    []float64            `json:"to_post,omitempty"`
}

// ServeBareClient is the process `postbox bench --serve-bare-client`: it
// reads a setup (one JSON line) from in, starts a forwarder, answers, and
// then answers each command line: "forget" drops the timings so far,
// "stop" (or the end of in) stops the forwarder and answers with its
// figures, and returns. A relay is always a process of its own, apart from
// the receiver's: a bare client in the bench's process hands its requests
// to a receiver that is already running, and so measures a floor a little
// under any relay's.
func ServeBareClient(ctx context.Context, in io.Reader, out io.Writer) error {
	enc := json.NewEncoder(out)
	lines := bufio.NewScanner(in)
	if !lines.Scan() {
		return errors.New("bare client: no setup on standard input")
	}
	var s bareClientSetup
	if err := json.Unmarshal(lines.Bytes(), &s); err != nil {
		return fmt.Errorf("bare client: read the setup: %w", err)
	}
	if err := proc.SetBatch(s.Batch); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		_ = enc.Encode(bareClientReply{Error: err.Error()})
		return err
	}
	fw, err := startForwarder(ctx, s.DBURL, s.Slot, s.Target, s.Secret)
	if err != nil {
		_ = enc.Encode(bareClientReply{Error: err.Error()})
		return err
	}
	if err := enc.Encode(bareClientReply{}); err != nil {
		_, _ = fw.stop()
		return err
	}
	for lines.Scan() && lines.Text() != "stop" {
		if lines.Text() == "forget" {
			_ = fw.forgetTimings()
			if err := enc.Encode(bareClientReply{}); err != nil {
				_, _ = fw.stop()
				return err
			}
		}
	}
	committed, err := fw.stop()
	reply := bareClientReply{Committed: committed}
	if err != nil {
		reply.Error = err.Error()
	}
	fw.mu.Lock()
	reply.ToSend, reply.ToStream, reply.ToPost = fw.toSend, fw.toStream, fw.toPost
	fw.mu.Unlock()
	return enc.Encode(reply)
}

// bareProcess is a bare client in a process of its own: this binary, run
// as `postbox bench --serve-bare-client`.
type bareProcess struct {
	cmd     *exec.Cmd
	in      io.WriteCloser
	out     *json.Decoder
	figures *forwarder // the timings the process answered stop with
}

// startBareProcess starts exe (this executable when "") as the bare
// client and waits for its stream to start.
func startBareProcess(ctx context.Context, exe string, log io.Writer, s bareClientSetup) (*bareProcess, error) {
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("find the postbox binary: %w", err)
		}
	}
	cmd := exec.Command(exe, "bench", BareClientArg)
	cmd.Stderr = log
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the bare client: %w", err)
	}
	bp := &bareProcess{cmd: cmd, in: in, out: json.NewDecoder(out)}
	stopped := context.AfterFunc(ctx, func() { _ = cmd.Process.Kill() })
	defer stopped()
	if err := json.NewEncoder(in).Encode(s); err != nil {
		bp.kill()
		return nil, fmt.Errorf("set up the bare client: %w", err)
	}
	if _, err := bp.answer(); err != nil {
		bp.kill()
		return nil, err
	}
	return bp, nil
}

// answer reads the process's next answer.
func (bp *bareProcess) answer() (bareClientReply, error) {
	var r bareClientReply
	if err := bp.out.Decode(&r); err != nil {
		return r, fmt.Errorf("the bare client's answer: %w", err)
	}
	if r.Error != "" {
		return r, fmt.Errorf("the bare client: %s", r.Error)
	}
	return r, nil
}

func (bp *bareProcess) kill() {
	_ = bp.cmd.Process.Kill()
	_ = bp.cmd.Wait()
}

func (bp *bareProcess) forgetTimings() error {
	if _, err := io.WriteString(bp.in, "forget\n"); err != nil {
		return err
	}
	_, err := bp.answer()
	return err
}

func (bp *bareProcess) stop() (map[string]time.Time, error) {
	_, _ = io.WriteString(bp.in, "stop\n")
	r, err := bp.answer()
	_ = bp.in.Close()
	if werr := bp.cmd.Wait(); err == nil && werr != nil {
		err = fmt.Errorf("the bare client: %w", werr)
	}
	bp.figures = &forwarder{toSend: r.ToSend, toStream: r.ToStream, toPost: r.ToPost}
	return r.Committed, err
}

func (bp *bareProcess) split() *Split {
	if bp.figures == nil {
		return nil
	}
	return bp.figures.split()
}
