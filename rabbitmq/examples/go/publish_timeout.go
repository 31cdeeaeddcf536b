// Publish one order timeout to order-timeout, per its wire contract (v1).
//
//	sudo apt-get install golang-go golang-github-rabbitmq-amqp091-go-dev
//	GO111MODULE=off GOPATH=/usr/share/gocode go run publish_timeout.go --order-id 42 --delay-ms 1800000
//
// In a module of your own, `go get github.com/rabbitmq/amqp091-go` instead.
//
// The same message works whether the service runs in plugin or TTL mode: the
// exchange is the configured prefix (default "order.timeouts"), the routing key
// is the kind, the header x-delay holds the delay in integer milliseconds, and
// the body is JSON with the order id as a string.
//
// x-delay goes out as a signed 64-bit integer (AMQP type 'l') because it is an
// int64: amqp091-go writes a Go int as a 32-bit 'I', cutting off the high bits
// on 64-bit machines, so never put a plain int in a header.
package main

import (
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const maxDelayMs = 4294967295 // the plugin's limit, about 49.7 days

func usage(message string) {
	fmt.Fprintln(os.Stderr, message)
	flag.Usage()
	os.Exit(2)
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "publish failed: "+format+"\n", args...)
	os.Exit(1)
}

// uuid4 is a random (version 4) UUID, the message's unique id.
func uuid4() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		fail("no randomness: %v", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func main() {
	url := flag.String("url", "amqp://guest:guest@127.0.0.1:5672/%2f", "the broker")
	exchange := flag.String("exchange", "order.timeouts", "the service's entry exchange (its prefix)")
	orderID := flag.String("order-id", "", "the order's id (sent as a string; required)")
	kind := flag.String("kind", "payment", "payment, fulfillment or receipt")
	delayMs := flag.Int64("delay-ms", 0, fmt.Sprintf("milliseconds until the deadline, 1 to %d (required)", int64(maxDelayMs)))
	flag.Parse()
	if flag.NArg() > 0 {
		usage(fmt.Sprintf("unexpected argument: %s", flag.Arg(0)))
	}
	if *orderID == "" {
		usage("--order-id is required")
	}
	if *kind != "payment" && *kind != "fulfillment" && *kind != "receipt" {
		usage("--kind must be payment, fulfillment or receipt")
	}
	if *delayMs < 1 || *delayMs > maxDelayMs {
		usage(fmt.Sprintf("--delay-ms must be from 1 to %d", int64(maxDelayMs)))
	}

	now := time.Now().UTC()
	body, err := json.Marshal(map[string]string{
		"order_id": *orderID, // a string: ids above 2^53 do not survive JSON numbers
		"kind":     *kind,
		"due_at":   now.Add(time.Duration(*delayMs) * time.Millisecond).Format("2006-01-02T15:04:05.000Z07:00"),
	})
	if err != nil {
		fail("%v", err)
	}

	conn, err := amqp.Dial(*url)
	if err != nil {
		fail("%v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		fail("%v", err)
	}
	// Publisher confirms: the broker acks once the message is safe with it.
	if err := ch.Confirm(false); err != nil {
		fail("%v", err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))

	// No mandatory flag needed: the entry exchange is a fanout to the
	// service's ingest queue in both delay modes, so it always has a route.
	err = ch.Publish(*exchange, *kind, false, false, amqp.Publishing{
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent, // the timer must survive a broker restart
		MessageId:    uuid4(),
		Timestamp:    now,
		Headers:      amqp.Table{"x-delay": *delayMs}, // int64: AMQP 'l'
		Body:         body,
	})
	if err != nil {
		fail("%v", err)
	}
	select {
	case c, ok := <-confirms:
		if !ok {
			// The broker closed the channel (a missing exchange, say).
			fail("%v", <-closed)
		}
		if !c.Ack {
			fail("the broker nacked the message")
		}
	case <-time.After(10 * time.Second):
		fail("no confirm from the broker within 10 s")
	}
	fmt.Printf("scheduled %s timeout for order %s in %d ms\n", *kind, *orderID, *delayMs)
}
