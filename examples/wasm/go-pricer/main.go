// Command go-pricer is an example WebAssembly worker in Go: it prices an
// order, like examples/python/enrich.
//
// Input: a CloudEvent whose data is {"items": [{"sku": ..., "price": ...,
// "qty": ...}]}. Output: one "order.priced" event (published to the topic
// "order.priced") with the total, keeping the input's correlationid. An
// item without a price fails the attempt. Build (Go 1.24+):
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o go-pricer.wasm .
//
// and create the worker with MIME type application/wasm (wmctl create
// go-pricer.wasm --topic orders).
package main

import (
	"encoding/json"
	"fmt"

	"github.com/virtufin/workmanager/sdk/wasm/wmwasm"
)

type order struct {
	Items []struct {
		SKU   string   `json:"sku"`
		Price *float64 `json:"price"`
		Qty   *float64 `json:"qty"`
	} `json:"items"`
}

func price(ev *wmwasm.Event) ([]wmwasm.Output, error) {
	var o order
	if len(ev.Data) > 0 {
		if err := json.Unmarshal(ev.Data, &o); err != nil {
			return nil, fmt.Errorf("the order is not JSON: %w", err)
		}
	}
	total := 0.0
	for _, it := range o.Items {
		if it.Price == nil {
			return nil, fmt.Errorf("item %q has no price", it.SKU)
		}
		qty := 1.0
		if it.Qty != nil {
			qty = *it.Qty
		}
		total += *it.Price * qty
	}
	id, _, _ := wmwasm.Identity()
	wmwasm.Log(wmwasm.LevelInfo, fmt.Sprintf("priced order %s: %d items, total %g", ev.ID, len(o.Items), total))
	data, err := json.Marshal(map[string]any{"order_id": ev.ID, "total": total, "items": len(o.Items), "priced_by": id})
	if err != nil {
		return nil, err
	}
	out := ev.Reply("order.priced", data)
	out.Subject = ev.ID
	return []wmwasm.Output{out}, nil
}

func init() { wmwasm.Handle(price) }

// main is not run: a reactor module (-buildmode=c-shared) only runs its
// package initialisers, where the handler is registered.
func main() {}
