// Command publish_timeout schedules order timeouts with order-timeout, per its
// wire contract (v1), through the Publisher of publisher.go: one long-lived
// connection with publisher confirms, repaired with backoff when it drops.
//
// One timeout, due at the order's deadline (or in --delay-ms):
//
//	publish_timeout --order-id 42 --due-at 2026-12-05T10:30:00Z
//	publish_timeout --order-id 42 --kind receipt --delay-ms 1209600000
//
// Many, one JSON object per line on standard input, each published as it is
// read and printed once the broker has confirmed it:
//
//	echo '{"order_id": "42", "kind": "payment", "due_at": "2026-12-05T10:30:00Z"}' | publish_timeout --stdin
//
// Exit status: 0 when every timeout was confirmed, 1 when one was not (the
// reason on standard error), 2 on bad flags or input.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func usage(message string) {
	fmt.Fprintln(os.Stderr, message)
	flag.Usage()
	os.Exit(2)
}

func main() {
	url := flag.String("url", "amqp://guest:guest@127.0.0.1:5672/%2f", "the broker, with its vhost")
	exchange := flag.String("exchange", "order.timeouts", "the service's entry exchange (its amqp.prefix)")
	name := flag.String("connection-name", "publish_timeout (go)", "the connection's name in the management UI")
	orderID := flag.String("order-id", "", "the order's id (sent as a string)")
	kind := flag.String("kind", "payment", "payment, fulfillment or receipt (the default kind of --stdin lines too)")
	dueAt := flag.String("due-at", "", "the order's deadline, RFC 3339: the delay is the time left until it")
	delayMs := flag.Int64("delay-ms", 0, fmt.Sprintf("instead of --due-at: milliseconds until the deadline, 1 to %d", MaxDelay.Milliseconds()))
	stdin := flag.Bool("stdin", false, `read timeouts from standard input, one JSON object per line: {"order_id": "42", "kind": "payment", "due_at": "…"}`)
	timeout := flag.Duration("timeout", 30*time.Second, "how long one timeout may take to be confirmed, reconnections included")
	flag.Parse()
	if flag.NArg() > 0 {
		usage(fmt.Sprintf("unexpected argument: %s", flag.Arg(0)))
	}
	if !isKind(*kind) {
		usage("--kind must be payment, fulfillment or receipt")
	}

	// The one timeout of the flags, checked before connecting.
	var single *Timeout
	if *stdin {
		if *orderID != "" || *dueAt != "" || *delayMs != 0 {
			usage("--stdin takes no --order-id, --due-at or --delay-ms")
		}
	} else {
		t, err := fromFlags(*orderID, *kind, *dueAt, *delayMs)
		if err != nil {
			usage(err.Error())
		}
		single = &t
	}

	logger := log.New(os.Stderr, "publish_timeout: ", log.LstdFlags)
	publisher, err := NewPublisher(Config{URL: *url, Exchange: *exchange, ConnectionName: *name, Logger: logger})
	if err != nil {
		fmt.Fprintf(os.Stderr, "publish failed: %v\n", err)
		os.Exit(1)
	}
	defer publisher.Close()

	// Ctrl-C or SIGTERM: stop reading, give up on what is not confirmed yet.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	out := log.New(os.Stdout, "", 0) // one whole line per write, whatever goroutine writes
	var failed atomic.Bool
	schedule := func(t Timeout) {
		attempt, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		if err := publisher.Schedule(attempt, t); err != nil {
			failed.Store(true)
			fmt.Fprintf(os.Stderr, "publish failed: order %s: %v\n", t.OrderID, err)
			return
		}
		out.Printf("scheduled %s timeout for order %s, due %s", t.Kind, t.OrderID, t.DueAt.UTC().Format(time.RFC3339Nano))
	}

	if single != nil {
		if *delayMs != 0 {
			// The delay counts from the publish, not from the program's start.
			single.DueAt = time.Now().Add(time.Duration(*delayMs) * time.Millisecond)
		}
		schedule(*single)
	} else if err := eachLine(ctx, os.Stdin, *kind, schedule); err != nil {
		publisher.Close()
		fmt.Fprintf(os.Stderr, "standard input: %v\n", err)
		os.Exit(2)
	}
	if failed.Load() {
		publisher.Close()
		os.Exit(1)
	}
}

// fromFlags is the timeout of --order-id with --due-at or --delay-ms.
func fromFlags(orderID, kind, dueAt string, delayMs int64) (Timeout, error) {
	t := Timeout{OrderID: orderID, Kind: kind}
	switch {
	case orderID == "":
		return t, errors.New("--order-id is required (or --stdin)")
	case (dueAt == "") == (delayMs == 0):
		return t, errors.New("give one of --due-at and --delay-ms")
	case dueAt != "":
		due, err := time.Parse(time.RFC3339Nano, dueAt)
		if err != nil {
			return t, fmt.Errorf("--due-at: %v", err)
		}
		t.DueAt = due
	case delayMs < 1 || delayMs > MaxDelay.Milliseconds():
		return t, fmt.Errorf("--delay-ms must be from 1 to %d", MaxDelay.Milliseconds())
	default:
		t.DueAt = time.Now().Add(time.Duration(delayMs) * time.Millisecond)
	}
	return t, nil
}

// eachLine schedules the timeout of each line of r concurrently, at most 64
// at a time, as a shop's checkout handlers would share one Publisher; it
// returns once all are done, or the first line that is not a timeout.
func eachLine(ctx context.Context, r io.Reader, kind string, schedule func(Timeout)) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, 64)
	lines := bufio.NewScanner(r)
	for n := 1; lines.Scan() && ctx.Err() == nil; n++ {
		text := strings.TrimSpace(lines.Text())
		if text == "" {
			continue
		}
		var line struct {
			OrderID string    `json:"order_id"`
			Kind    string    `json:"kind"`
			DueAt   time.Time `json:"due_at"` // RFC 3339
		}
		if err := json.Unmarshal([]byte(text), &line); err != nil {
			return fmt.Errorf("line %d: %v", n, err)
		}
		if line.Kind == "" {
			line.Kind = kind
		}
		t := Timeout{OrderID: line.OrderID, Kind: line.Kind, DueAt: line.DueAt}
		if err := t.check(time.Now()); err != nil {
			return fmt.Errorf("line %d: %v", n, err)
		}
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			schedule(t)
		}()
	}
	return lines.Err()
}
