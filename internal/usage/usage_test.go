package usage

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"
)

func fleetSample(pods int, at time.Time, load uint64) Sample {
	s := Sample{Time: at, Window: 15 * time.Second, Node: Resources{CPUNanoCores: 1_250_000_000 + load*1000, MemoryWorkingSetBytes: 900 << 20}}
	for i := range pods {
		s.Pods = append(s.Pods, Pod{Namespace: "shop", Name: fmt.Sprintf("till-%02d-7d9f8c6b5-x2x4q", i), Containers: []Container{
			{Name: "app", Usage: Resources{CPUNanoCores: uint64(i)*3_000_000 + load*1000, MemoryWorkingSetBytes: uint64(20+i) << 20}},
		}})
	}
	return s
}

func roundTrip(t *testing.T, e *Encoder, d *Decoder, s Sample) int {
	t.Helper()
	p, err := e.Encode(s)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	got, err := d.Decode(p)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if !reflect.DeepEqual(got, s) {
		t.Fatalf("Decode gave\n%+v\nwant\n%+v", got, s)
	}
	return len(p)
}

func TestStream(t *testing.T) {
	var e Encoder
	var d Decoder
	at := time.UnixMilli(1_790_000_000_000)
	full := roundTrip(t, &e, &d, fleetSample(50, at, 0))
	var changes int
	for i := 1; i <= 4; i++ {
		changes += roundTrip(t, &e, &d, fleetSample(50, at.Add(time.Duration(i)*15*time.Second), uint64(i*37)))
	}
	t.Logf("50 pods: full sample %d bytes, changes %d bytes per sample", full, changes/4)
	if changes/4 > 400 {
		t.Errorf("changes of 50 pods take %d bytes, want at most 400", changes/4)
	}
	// A new pod sends the table again.
	s := fleetSample(51, at.Add(time.Minute+15*time.Second), 5)
	roundTrip(t, &e, &d, s)
	// Values fall as well as rise.
	s = fleetSample(3, at.Add(2*time.Minute), 0)
	roundTrip(t, &e, &d, s)
	s.Node.CPUNanoCores = 0
	s.Time = s.Time.Add(time.Second)
	roundTrip(t, &e, &d, s)
}

func TestResetStartsAFreshDecoder(t *testing.T) {
	var e Encoder
	var d Decoder
	at := time.UnixMilli(1_790_000_000_000)
	roundTrip(t, &e, &d, fleetSample(2, at, 0))
	p, err := e.Encode(fleetSample(2, at.Add(time.Second), 1))
	if err != nil {
		t.Fatal(err)
	}
	var fresh Decoder
	if _, err := fresh.Decode(p); !errors.Is(err, ErrNoBase) {
		t.Fatalf("changes to a fresh decoder: %v, want ErrNoBase", err)
	}
	e.Reset()
	roundTrip(t, &e, &fresh, fleetSample(2, at.Add(2*time.Second), 2))
}

func TestBadPayloadLeavesDecoderUnchanged(t *testing.T) {
	var e Encoder
	var d Decoder
	at := time.UnixMilli(1_790_000_000_000)
	roundTrip(t, &e, &d, fleetSample(2, at, 0))
	before := d
	for name, p := range map[string][]byte{
		"empty":           nil,
		"version":         {9, 0},
		"flags":           {version, 0x80},
		"deflated deltas": {version, flagDeflated, 1},
		"short changes":   {version, 0, 2, 2},
		"trailing":        append([]byte{version, 0}, make([]byte, 16)...),
		"underflow":       {version, 0, 0, 0, 0x81, 0x80, 0x80, 0x80, 0x10, 0, 0, 0, 0, 0},
		"bad name":        {version, flagTable, 1, 1, 1, 1, '/', 1, 'a', 0, 0, 0},
		"too many pods":   {version, flagTable, 1, 1, 0xff, 0xff, 0x03},
	} {
		if _, err := d.Decode(p); err == nil {
			t.Errorf("%s: Decode took %x", name, p)
		}
		if !reflect.DeepEqual(d, before) {
			t.Fatalf("%s: a refused payload changed the decoder", name)
		}
	}
	roundTrip(t, &e, &d, fleetSample(2, at.Add(time.Second), 3))
}

func TestEncodeRefusesWhatADecoderWould(t *testing.T) {
	var e Encoder
	at := time.UnixMilli(1_790_000_000_000)
	for name, s := range map[string]Sample{
		"duplicate pod":       {Time: at, Pods: []Pod{{Namespace: "a", Name: "b"}, {Namespace: "a", Name: "b"}}},
		"duplicate container": {Time: at, Pods: []Pod{{Namespace: "a", Name: "b", Containers: []Container{{Name: "c"}, {Name: "c"}}}}},
		"empty name":          {Time: at, Pods: []Pod{{Namespace: "a"}}},
		"negative window":     {Time: at, Window: -time.Second},
		"before 1970":         {Time: time.UnixMilli(-5)},
	} {
		if _, err := e.Encode(s); err == nil {
			t.Errorf("%s: Encode took it", name)
		}
	}
	if e.have {
		t.Fatal("a refused sample changed the encoder")
	}
}

func FuzzDecode(f *testing.F) {
	var e Encoder
	at := time.UnixMilli(1_790_000_000_000)
	for i := range 3 {
		p, _ := e.Encode(fleetSample(i+1, at.Add(time.Duration(i)*time.Second), uint64(i)))
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		var d Decoder
		s, err := d.Decode(p)
		if err != nil {
			return
		}
		// Whatever decodes must encode again to the same sample.
		var e Encoder
		var d2 Decoder
		q, err := e.Encode(s)
		if err != nil {
			t.Fatalf("decoded sample does not encode: %v", err)
		}
		s2, err := d2.Decode(q)
		if err != nil || !reflect.DeepEqual(s, s2) {
			t.Fatalf("re-encoded sample differs: %v", err)
		}
	})
}
