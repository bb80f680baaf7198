package redisstreams

import (
	"encoding/json"
	"testing"
)

// A structured CloudEvent with data and no datacontenttype reaches daprd's
// runtime as application/json (daprd 1.14 drops the data of a gRPC
// delivery otherwise); every other payload is handed on byte for byte.
func TestDataWithoutContentTypeIsJSON(t *testing.T) {
	got := withJSONContentType([]byte(`{"specversion":"1.0","id":"1","source":"s","type":"t","data":{"a":1}}`))
	var ce map[string]any
	if err := json.Unmarshal(got, &ce); err != nil {
		t.Fatal(err)
	}
	if ce["datacontenttype"] != "application/json" || ce["data"].(map[string]any)["a"] != float64(1) || ce["id"] != "1" {
		t.Fatalf("got %s", got)
	}
	for _, keep := range []string{
		`{"specversion":"1.0","id":"1","source":"s","type":"t","datacontenttype":"text/plain","data":"x"}`,
		`{"specversion":"1.0","id":"1","source":"s","type":"t","data_base64":"eA=="}`,
		`{"specversion":"1.0","id":"1","source":"s","type":"t","data":null}`,
		`{"specversion":"1.0","id":"1","source":"s","type":"t"}`,
		`{"data":{"a":1}}`, // not a CloudEvent (a raw payload)
		`not json "data"`,
	} {
		if got := withJSONContentType([]byte(keep)); string(got) != keep {
			t.Errorf("%s became %s", keep, got)
		}
	}
}
