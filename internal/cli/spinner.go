package cli

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// IsTerminal says whether f is a terminal (a character device).
func IsTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// startSpinner shows msg with a spinner on w until the returned function
// is called, which erases it; it does nothing unless on is set (w is a
// terminal), so that logs and pipes get no control characters.
func startSpinner(w io.Writer, on bool, msg string) func() {
	if !on {
		return func() {}
	}
	frames := []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		start := time.Now()
		for i := 0; ; i++ {
			fmt.Fprintf(w, "\r%s %s… %ds", frames[i%len(frames)], msg, int(time.Since(start).Seconds()))
			select {
			case <-done:
				fmt.Fprint(w, "\r\033[K")
				return
			case <-t.C:
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
	}
}
