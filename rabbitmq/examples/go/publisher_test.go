package main

import (
	"strings"
	"testing"
	"time"
)

func TestDelayIsTheTimeLeftRoundedUpAndAtLeastOneMillisecond(t *testing.T) {
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		left time.Duration
		want int64
	}{
		{30 * time.Minute, 1800000},
		{1999*time.Millisecond + 400*time.Microsecond, 2000}, // never due before the order
		{time.Millisecond, 1},
		{time.Microsecond, 1},
		{0, 1},                 // due now: the smallest delay the service takes
		{-time.Hour, 1},        // already past: at once, the database decides
		{MaxDelay, 4294967295}, // the longest, still an int64 on the wire
	} {
		got := Timeout{DueAt: now.Add(c.left)}.Delay(now)
		if got != c.want {
			t.Errorf("%v left: x-delay %d, want %d", c.left, got, c.want)
		}
	}
}

func TestCheckRefusesWhatTheServiceWouldPark(t *testing.T) {
	now := time.Now()
	ok := Timeout{OrderID: "42", Kind: "payment", DueAt: now.Add(time.Minute)}
	if err := ok.check(now); err != nil {
		t.Fatalf("a valid timeout refused: %v", err)
	}
	for _, c := range []struct {
		change func(*Timeout)
		says   string
	}{
		{func(t *Timeout) { t.Kind = "refund" }, "unknown kind"},
		{func(t *Timeout) { t.OrderID = "" }, "no order id"},
		{func(t *Timeout) { t.DueAt = time.Time{} }, "no deadline"},
		{func(t *Timeout) { t.DueAt = now.Add(MaxDelay + time.Second) }, "longest delay"},
	} {
		bad := ok
		c.change(&bad)
		err := bad.check(now)
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%+v: got %v, want an error saying %q", bad, err, c.says)
		}
	}
}
