// Publisher schedules order timeouts with order-timeout over one long-lived
// AMQP connection, per the service's wire contract (v1, docs/wire-contract.md).
// This file is the part to copy into a shop's code base; main.go is a
// command-line driver around it.
//
// The same message works whatever delay mode the service runs (plugin, ttl or
// native): the exchange is the service's prefix (default "order.timeouts"),
// the routing key is the kind, the header x-delay holds the delay in integer
// milliseconds, and the body is JSON with the order id as a string.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// MaxDelay is the longest delay the service accepts, 2^32-1 ms (about 49.7
// days: the delayed-message plugin's limit, which every mode keeps).
const MaxDelay = 4294967295 * time.Millisecond

// Kinds are the service's timeout kinds: the routing key, and the body's kind.
var Kinds = []string{"payment", "fulfillment", "receipt"}

// ErrClosed is returned by Schedule once Close was called.
var ErrClosed = errors.New("publisher closed")

// Timeout is one deadline of one order, as the shop stored it at checkout.
type Timeout struct {
	// OrderID goes out as a JSON string: ids above 2^53 do not survive JSON
	// numbers.
	OrderID string
	// Kind is payment, fulfillment or receipt.
	Kind string
	// DueAt is the order's own deadline (placed at + its window). The delay is
	// computed from it when the message goes out, so time spent before the
	// publish (a reconnection, say) does not move the deadline.
	DueAt time.Time
}

// Config says where to publish and how patiently.
type Config struct {
	// URL of the broker, amqp:// or amqps://, with the vhost.
	URL string
	// Exchange is the service's amqp.prefix (default "order.timeouts").
	Exchange string
	// ConnectionName is shown in the management UI, so that an operator can
	// tell this publisher's connection from the service's.
	ConnectionName string
	// ConfirmTimeout bounds the wait for the broker's confirm of one publish
	// (default 5 s). Past it the channel is replaced and the message sent
	// again.
	ConfirmTimeout time.Duration
	// MinBackoff and MaxBackoff bound the pause between reconnection attempts,
	// doubling from one to the other (defaults 100 ms and 10 s).
	MinBackoff, MaxBackoff time.Duration
	// Logger receives one line per lost and per restored connection (default:
	// the standard logger).
	Logger *log.Logger
}

// Publisher keeps one connection and one confirm-mode channel open, and
// replaces them, with backoff, when the broker or the network closes either.
// Schedule is safe for concurrent use: each call waits for its own confirm.
type Publisher struct {
	cfg Config
	// done is closed by Close; stopped once the supervisor has closed the
	// connection and returned.
	done, stopped chan struct{}
	closeOnce     sync.Once

	mu sync.Mutex
	// ch is the channel to publish on; nil while reconnecting.
	ch *amqp.Channel
	// changed is closed (and replaced) whenever ch changes, waking the
	// Schedule calls that wait for a usable channel.
	changed chan struct{}
	// lost is why the last channel went away, for the error of a Schedule
	// that gave up waiting.
	lost error
	// closed is set by Close: Schedule refuses new work.
	closed bool
}

// NewPublisher connects, once: a wrong URL or wrong credentials fail here
// rather than being retried forever. Later losses are repaired in the
// background until Close.
func NewPublisher(cfg Config) (*Publisher, error) {
	if cfg.ConfirmTimeout <= 0 {
		cfg.ConfirmTimeout = 5 * time.Second
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = log.Default()
	}
	p := &Publisher{
		cfg:     cfg,
		done:    make(chan struct{}),
		stopped: make(chan struct{}),
		changed: make(chan struct{}),
	}
	conn, err := p.dial()
	if err != nil {
		return nil, err
	}
	go p.supervise(conn)
	return p, nil
}

func (p *Publisher) dial() (*amqp.Connection, error) {
	return amqp.DialConfig(p.cfg.URL, amqp.Config{
		// An address that does not answer is given up after 5 s (not the
		// operating system's minutes), then the backoff decides.
		Dial:       amqp.DefaultDial(5 * time.Second),
		Heartbeat:  10 * time.Second, // a dead peer is noticed within about 20 s
		Locale:     "en_US",
		Properties: amqp.Table{"connection_name": p.cfg.ConnectionName},
	})
}

// openChannel opens a channel in confirm mode: the broker then acks each
// message once it has taken responsibility for it (written to disk for a
// persistent message on a durable queue).
func openChannel(conn *amqp.Connection) (*amqp.Channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, err
	}
	return ch, nil
}

// supervise owns the connection: it hands out a channel, waits until the
// connection or the channel closes, and opens new ones after a pause that
// doubles with each loss in a row.
func (p *Publisher) supervise(conn *amqp.Connection) {
	defer close(p.stopped)
	backoff := p.cfg.MinBackoff
	for {
		// Buffered, and each registered once: amqp091-go sends the close
		// reason synchronously and would block on a listener nobody reads.
		connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
		for !conn.IsClosed() {
			ch, err := openChannel(conn)
			if err != nil {
				// A connection that refuses channels is replaced.
				p.setChannel(nil, fmt.Errorf("opening a channel: %w", err))
				conn.Close()
			} else {
				chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
				opened := time.Now()
				p.setChannel(ch, nil)
				select {
				case <-p.done:
					p.setChannel(nil, ErrClosed)
					conn.Close() // closes the channel too
					return
				case reason := <-connClosed:
					p.setChannel(nil, closedBy("connection", reason))
				case reason := <-chClosed:
					// A channel error (a missing exchange, say) leaves the
					// connection up: only the channel is replaced.
					p.setChannel(nil, closedBy("channel", reason))
				}
				// A channel that lived longer than the longest pause was a
				// recovery: this loss starts the backoff afresh.
				if time.Since(opened) > p.cfg.MaxBackoff {
					backoff = p.cfg.MinBackoff
				}
			}
			p.cfg.Logger.Printf("%v; reopening in %v", p.lastLoss(), backoff)
			if !p.pause(&backoff) {
				conn.Close()
				return
			}
		}
		for {
			var err error
			if conn, err = p.dial(); err == nil {
				p.cfg.Logger.Printf("reconnected to the broker")
				break
			}
			p.setChannel(nil, fmt.Errorf("reconnecting: %w", err))
			p.cfg.Logger.Printf("reconnecting: %v; next attempt in %v", err, backoff)
			if !p.pause(&backoff) {
				return
			}
		}
	}
}

// closedBy says what closed: the broker's reason, or none on a close of our
// own (a channel given up after a missing confirm).
func closedBy(what string, reason *amqp.Error) error {
	if reason == nil {
		return fmt.Errorf("%s closed", what)
	}
	return fmt.Errorf("%s closed: %v", what, reason)
}

// pause waits for the current backoff, then doubles it up to MaxBackoff;
// false when Close was called meanwhile.
func (p *Publisher) pause(backoff *time.Duration) bool {
	timer := time.NewTimer(*backoff)
	defer timer.Stop()
	*backoff *= 2
	if *backoff > p.cfg.MaxBackoff {
		*backoff = p.cfg.MaxBackoff
	}
	select {
	case <-p.done:
		p.setChannel(nil, ErrClosed)
		return false
	case <-timer.C:
		return true
	}
}

func (p *Publisher) setChannel(ch *amqp.Channel, lost error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ch = ch
	if lost != nil {
		p.lost = lost
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Publisher) lastLoss() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lost
}

// channel returns the channel to publish on, waiting while there is none or
// while the one at hand is stale (the one a publish just failed on, which the
// supervisor has not replaced yet).
func (p *Publisher) channel(ctx context.Context, stale *amqp.Channel) (*amqp.Channel, error) {
	for {
		p.mu.Lock()
		ch, changed, closed, lost := p.ch, p.changed, p.closed, p.lost
		p.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		if ch != nil && ch != stale {
			return ch, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			if lost != nil {
				return nil, fmt.Errorf("%w (the broker: %v)", ctx.Err(), lost)
			}
			return nil, ctx.Err()
		}
	}
}

// Close stops reconnecting and closes the connection. Call it after the
// Schedule calls in progress have returned: those still waiting fail.
func (p *Publisher) Close() {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		close(p.done)
	})
	<-p.stopped
}

// errLost marks a publish whose confirm went with its channel: it may or
// may not have reached the broker, so it is sent again.
var errLost = errors.New("the channel closed before the broker confirmed")

// errNacked is the broker refusing a message (an internal error on its side).
var errNacked = errors.New("the broker nacked the message")

// Schedule publishes t and returns once the broker has confirmed it. Through
// a reconnection it waits for the new channel and publishes again when the
// confirm was lost with the old one, until ctx is done: delivery is at least
// once, and the service takes duplicates (the deadline in its database
// decides, a second message for the same order changes nothing).
func (p *Publisher) Schedule(ctx context.Context, t Timeout) error {
	if err := t.check(time.Now()); err != nil {
		return err
	}
	// One id for every attempt: a duplicate is recognisable as one.
	messageID, err := uuid4()
	if err != nil {
		return err
	}
	var stale *amqp.Channel
	backoff := p.cfg.MinBackoff
	for {
		ch, err := p.channel(ctx, stale)
		if err != nil {
			return err
		}
		err = p.publish(ctx, ch, t, messageID)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, errLost):
			stale = ch // wait for the supervisor's next channel
		case errors.Is(err, errNacked):
			// Rare, and the broker's to resolve: try again after a pause.
			timer := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				timer.Stop()
				return fmt.Errorf("%w (%v)", ctx.Err(), err)
			case <-timer.C:
			}
			if backoff *= 2; backoff > p.cfg.MaxBackoff {
				backoff = p.cfg.MaxBackoff
			}
		default:
			return err
		}
	}
}

// check refuses what the service would park: an unknown kind, no order id,
// a deadline beyond the longest delay.
func (t Timeout) check(now time.Time) error {
	switch {
	case !isKind(t.Kind):
		return fmt.Errorf("unknown kind %q (payment, fulfillment or receipt)", t.Kind)
	case t.OrderID == "":
		return errors.New("no order id")
	case t.DueAt.IsZero():
		return errors.New("no deadline")
	case t.DueAt.Sub(now) > MaxDelay:
		return fmt.Errorf("deadline %s is more than %v away, the longest delay the service takes", t.DueAt.Format(time.RFC3339), MaxDelay)
	}
	return nil
}

func isKind(kind string) bool {
	for _, k := range Kinds {
		if kind == k {
			return true
		}
	}
	return false
}

// Delay is what x-delay says for t when published at now: the time left
// until the order's deadline, rounded up to whole milliseconds so that the
// message is never due before the order, and at least 1 ms (the service
// refuses 0; a deadline already past is acted on at once, still judged by
// the database).
func (t Timeout) Delay(now time.Time) int64 {
	left := t.DueAt.Sub(now)
	ms := int64((left + time.Millisecond - 1) / time.Millisecond)
	if ms < 1 {
		return 1
	}
	return ms
}

// publish sends one message and waits for its confirm, at most
// ConfirmTimeout.
func (p *Publisher) publish(ctx context.Context, ch *amqp.Channel, t Timeout, messageID string) error {
	now := time.Now()
	body, err := json.Marshal(struct {
		OrderID string `json:"order_id"`
		Kind    string `json:"kind"`
		DueAt   string `json:"due_at"`
	}{t.OrderID, t.Kind, t.DueAt.UTC().Format("2006-01-02T15:04:05.000Z07:00")})
	if err != nil {
		return err
	}
	attempt, cancel := context.WithTimeout(ctx, p.cfg.ConfirmTimeout)
	defer cancel()
	confirm, err := ch.PublishWithDeferredConfirmWithContext(attempt,
		p.cfg.Exchange,
		t.Kind, // the routing key is the kind
		// No mandatory: the entry exchange is a fanout bound to the
		// service's ingest queue in every delay mode, so every message has
		// a route. (Never publish straight to the plugin's delayed-message
		// exchange: it returns every mandatory publish as unroutable while
		// still delivering it later.)
		false,
		false, // immediate: not supported by RabbitMQ
		amqp.Publishing{
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent, // the timer must survive a broker restart
			MessageId:    messageID,
			Timestamp:    now, // sent in whole seconds
			// An int64 goes out as a signed 64-bit integer (AMQP 'l'). Never
			// put a plain int in a header: amqp091-go writes it as a 32-bit
			// 'I', cutting off the high bits of a long delay.
			Headers: amqp.Table{"x-delay": t.Delay(now)},
			Body:    body,
		})
	if err != nil {
		// The channel is closed, or the connection under it failed to
		// write (a network cut): either way it is replaced, and the
		// message goes again on the next one.
		ch.Close()
		return fmt.Errorf("%w: %v", errLost, err)
	}
	if confirm == nil {
		return errors.New("the channel is not in confirm mode")
	}
	// Wait returns true on the broker's ack, false on a nack and when the
	// channel closes (every unconfirmed message of a closed channel counts
	// as nacked); in amqp091-go 1.5 also when the attempt's context ends.
	acked := make(chan bool, 1)
	go func() { acked <- confirm.Wait() }()
	select {
	case ack := <-acked:
		switch {
		case ack:
			return nil
		case ch.IsClosed():
			return errLost
		case attempt.Err() == nil:
			return errNacked
		}
	case <-attempt.Done():
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// No confirm within ConfirmTimeout on a channel that looks open: replace
	// the channel (its other unconfirmed messages go again too) rather than
	// wait on it.
	ch.Close()
	return errLost
}

// uuid4 is a random (version 4) UUID, the message's unique id.
func uuid4() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("no randomness for a message id: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}
