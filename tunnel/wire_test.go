package tunnel

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
)

func TestHelloRoundTrip(t *testing.T) {
	for i, h := range []Hello{
		{Node: "n1"},
		{Node: "edge-7", Version: "v1.2.3", ResourceVersions: map[string]string{"pods": "10", "services": "", "": "x"}},
	} {
		features := uint64(i * (featureParity | featureBulk))
		b := appendFrame(nil, frameHello, marshalHello(h, features))
		typ, payload, err := readFrame(bufio.NewReader(bytes.NewReader(b)))
		if err != nil || typ != frameHello {
			t.Fatalf("readFrame: %v, %#x", err, typ)
		}
		got, f, err := unmarshalHello(payload)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, h) || f != (helloFeatures{flags: features, known: true}) {
			t.Fatalf("got %+v %+v, want %+v with features %d", got, f, h, features)
		}
	}
	// An older edge's hello ends after the resourceVersions: its
	// features are unknown until its features frame.
	old := marshalHello(Hello{Node: "n1"}, 0)
	if h, f, err := unmarshalHello(old[:len(old)-1]); err != nil || h.Node != "n1" || f.known {
		t.Fatalf("older hello: %+v %+v %v", h, f, err)
	}
	// An idle heartbeat is two bytes on the wire.
	if n := len(appendFrame(nil, frameHeartbeat, nil)); n != 2 {
		t.Fatalf("heartbeat frame is %d bytes", n)
	}
}

func TestWelcomeAndFeaturesRoundTrip(t *testing.T) {
	for _, w := range []welcome{{idleTimeoutMillis: 45000}, {echo: true}, {parity: true}, {bulk: true}, {1, true, true, true}} {
		got, err := unmarshalWelcome(marshalWelcome(w))
		if err != nil || got != w {
			t.Fatalf("welcome %+v came back as %+v, %v", w, got, err)
		}
	}
	if f, err := unmarshalFeatures(marshalFeatures(featureParity)); err != nil || f != featureParity {
		t.Fatalf("features: %d, %v", f, err)
	}
	// A welcome from a hub that knows nothing of parity decodes as none.
	if w, err := unmarshalWelcome([]byte{0x10, 0x01}); err != nil || w.parity || !w.echo {
		t.Fatalf("old welcome: %+v, %v", w, err)
	}
}

func TestReadFrameLimits(t *testing.T) {
	big := appendFrame(nil, frameHello, make([]byte, maxFrame+1))
	if _, _, err := readFrame(bufio.NewReader(bytes.NewReader(big))); !errors.Is(err, errFrameTooLarge) {
		t.Fatalf("oversized frame: %v", err)
	}
	trunc := appendFrame(nil, frameDial, []byte("tcp:1.2.3.4:5"))[:5]
	if _, _, err := readFrame(bufio.NewReader(bytes.NewReader(trunc))); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated frame: %v", err)
	}
	if _, _, err := readFrame(bufio.NewReader(bytes.NewReader(nil))); err != io.EOF {
		t.Fatalf("empty input: %v", err)
	}
}

func FuzzFrame(f *testing.F) {
	f.Add(appendFrame(nil, frameHeartbeat, nil))
	f.Add(appendFrame(nil, frameDial, []byte("tcp:10.0.0.1:10250")))
	f.Add(appendFrame(nil, frameGoAway, marshalGoAway(30000)))
	f.Add([]byte{0x11, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		// The unbuffered reader used on streams and a buffered one must
		// agree, and a decoded frame must re-encode to its input prefix.
		typ, payload, err := readFrame(&byteReader{r: bytes.NewReader(b)})
		typ2, payload2, err2 := readFrame(bufio.NewReader(bytes.NewReader(b)))
		if (err == nil) != (err2 == nil) || typ != typ2 || !bytes.Equal(payload, payload2) {
			t.Fatalf("readers disagree: %v/%v", err, err2)
		}
		if err != nil {
			return
		}
		if len(payload) > maxFrame {
			t.Fatalf("payload of %d bytes", len(payload))
		}
		enc := appendFrame(nil, typ, payload)
		if !bytes.HasPrefix(b, enc) && len(enc) > len(b) {
			t.Fatalf("re-encoding is longer than the input")
		}
		switch typ {
		case frameWelcome:
			unmarshalWelcome(payload)
		case frameGoAway:
			unmarshalGoAway(payload)
		case frameFeatures:
			unmarshalFeatures(payload)
		}
	})
}

func FuzzHello(f *testing.F) {
	f.Add(marshalHello(Hello{Node: "n1", Version: "v1", ResourceVersions: map[string]string{"pods": "5"}}, featureBulk))
	f.Add(marshalHello(Hello{}, 0))
	f.Add([]byte{1, 2, 'a', 'b', 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, feat, err := unmarshalHello(b)
		if err != nil {
			return
		}
		// Whatever decodes must survive a round trip.
		h2, feat2, err := unmarshalHello(marshalHello(h, feat.flags))
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if h.Node != h2.Node || h.Version != h2.Version || len(h.ResourceVersions) != len(h2.ResourceVersions) || feat2.flags != feat.flags {
			t.Fatalf("round trip changed %+v %+v to %+v %+v", h, feat, h2, feat2)
		}
		for k, v := range h.ResourceVersions {
			if h2.ResourceVersions[k] != v {
				t.Fatalf("round trip changed %q", k)
			}
		}
	})
}

func FuzzDialStatus(f *testing.F) {
	f.Add([]byte{statusOK, 'd', 'a', 't', 'a'})
	f.Add(appendDialFailure(nil, "dial tcp 127.0.0.1:1: connect: connection refused"))
	f.Add([]byte{statusFailed, 0xff, 0xff, 0xff, 0xff, 0x7f})
	f.Add([]byte{7})
	f.Fuzz(func(t *testing.T, b []byte) {
		br := bytes.NewReader(b)
		r := &byteReader{r: br}
		ok, msg, err := readDialStatus(r)
		if err != nil {
			return
		}
		if ok && (len(b) == 0 || b[0] != statusOK) {
			t.Fatal("ok without a status byte")
		}
		if !ok {
			if len(msg) > maxDialMessage {
				t.Fatalf("message of %d bytes", len(msg))
			}
			// Varints may be non-minimal, so compare the text, not the encoding.
			if !bytes.HasSuffix(b[:len(b)-br.Len()], []byte(msg)) {
				t.Fatal("message is not the input's last bytes read")
			}
		}
	})
}

func FuzzDataFrames(f *testing.F) {
	var seed []byte
	seed = append(seed, dataFrameData, 3, 'a', 'b', 'c')
	seed = append(seed, dataFrameData, 0)
	seed = append(seed, dataFrameReset, 0x85, 0x04)
	f.Add(seed)
	f.Add([]byte{dataFrameData, 10, 'x'})
	f.Add([]byte{9, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr := newDataFrameReader(bytes.NewReader(b))
		buf := make([]byte, 7)
		total := 0
		for range len(b) + 2 {
			n, _, reset, err := fr.read(buf)
			total += n
			if total > len(b) {
				t.Fatalf("read %d payload bytes from %d input bytes", total, len(b))
			}
			if reset || err != nil {
				return
			}
		}
		t.Fatal("decoder did not terminate")
	})
}
