package node

import (
	"fmt"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
)

// A checked body is handed out once, only under its own SHA-256, within
// checkedTTL; at most checkedMax bodies and checkedMaxBytes are kept, the
// oldest dropped first, and a large body is not kept at all.
func TestCheckedCodeIsBoundedAndContentAddressed(t *testing.T) {
	var c checkedCode
	now := time.Now()
	body := []byte("print('v1')")
	c.put(body, now)
	body[0] = 'X' // the caller's slice changed afterwards: the copy kept is not
	if _, ok := c.take(catalog.SHA256([]byte("other")), now); ok {
		t.Fatal("a body handed out under another SHA-256")
	}
	got, ok := c.take(catalog.SHA256([]byte("print('v1')")), now)
	if !ok || string(got) != "print('v1')" {
		t.Fatalf("take = %q, %v; want the body checked", got, ok)
	}
	if _, ok := c.take(catalog.SHA256([]byte("print('v1')")), now); ok {
		t.Fatal("a body handed out twice")
	}

	c.put([]byte("old"), now)
	if _, ok := c.take(catalog.SHA256([]byte("old")), now.Add(checkedTTL+time.Second)); ok {
		t.Fatal("a body older than checkedTTL handed out")
	}

	for i := range checkedMax + 4 {
		c.put([]byte(fmt.Sprint("body ", i)), now)
	}
	if len(c.bodies) != checkedMax || len(c.order) != checkedMax {
		t.Fatalf("%d bodies kept (%d in order), want %d", len(c.bodies), len(c.order), checkedMax)
	}
	if _, ok := c.take(catalog.SHA256([]byte("body 0")), now); ok {
		t.Fatal("the oldest body was kept past checkedMax")
	}
	if _, ok := c.take(catalog.SHA256([]byte(fmt.Sprint("body ", checkedMax+3))), now); !ok {
		t.Fatal("the newest body was dropped")
	}

	big := make([]byte, checkedMaxBytes/4+1)
	c.put(big, now)
	if _, ok := c.take(catalog.SHA256(big), now); ok {
		t.Fatal("a body larger than checkedMaxBytes/4 was kept")
	}
	for i := range 3 {
		c.put(append(make([]byte, checkedMaxBytes/4-10), byte(i)), now)
	}
	c.put(append(make([]byte, checkedMaxBytes/4-10), 9), now)
	if c.bytes > checkedMaxBytes {
		t.Fatalf("%d bytes kept, more than checkedMaxBytes %d", c.bytes, checkedMaxBytes)
	}
}
