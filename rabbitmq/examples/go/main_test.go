package main

import (
	"testing"
	"time"
)

func TestFlagsTakeADeadlineOrADelay(t *testing.T) {
	due := "2026-12-05T10:30:00Z"
	got, err := fromFlags("42", "receipt", due, 0)
	if err != nil || got.DueAt.Format(time.RFC3339) != due || got.Kind != "receipt" {
		t.Errorf("--due-at %s: %+v, %v", due, got, err)
	}
	before := time.Now()
	got, err = fromFlags("42", "payment", "", 1500)
	if err != nil || got.DueAt.Before(before.Add(1500*time.Millisecond)) {
		t.Errorf("--delay-ms 1500: %+v, %v", got, err)
	}
	for _, c := range []struct {
		orderID, dueAt string
		delayMs        int64
	}{
		{"", due, 0},
		{"42", "", 0},
		{"42", due, 1500},
		{"42", "tomorrow", 0},
		{"42", "", MaxDelay.Milliseconds() + 1},
		{"42", "", -5},
	} {
		if _, err := fromFlags(c.orderID, "payment", c.dueAt, c.delayMs); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
