package site

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// SetKeys sets the site's gossip keys, the one to encrypt with first. All
// are installed at once, so messages under any of them are read; the first
// becomes the key this member encrypts with after Config.KeyGrace when it
// is new and the previous one is still listed (the other members may not
// have it yet), at once otherwise; keys no longer listed are removed. This
// rotates keys without dropping the cluster as long as a rotation keeps
// the previous key listed for a while, as the hub's site key Secret does.
func (s *Site) SetKeys(keys [][]byte) error {
	var list [][]byte
	for i, k := range keys {
		if err := memberlist.ValidateKey(k); err != nil {
			return fmt.Errorf("set site key %d: %w", i, err)
		}
		if !slices.ContainsFunc(list, func(o []byte) bool { return bytes.Equal(o, k) }) {
			list = append(list, bytes.Clone(k))
		}
	}
	s.mu.Lock()
	if len(list) == 0 && len(s.keys) > 0 {
		// A running cluster keeps its keys: no key would mean no gossip.
		s.mu.Unlock()
		return fmt.Errorf("set site keys: no key")
	}
	s.keys = list
	running := s.ml != nil
	s.mu.Unlock()
	if len(list) > 0 {
		select {
		case s.keysSet <- struct{}{}:
		default:
		}
	}
	if running {
		s.installKeys(list, true)
	}
	return nil
}

// Keys returns the keys last set.
func (s *Site) Keys() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.keys)
}

// installKeys brings the running keyring to keys (see SetKeys).
func (s *Site) installKeys(keys [][]byte, grace bool) {
	kr := s.keyring
	for _, k := range keys {
		if err := kr.AddKey(k); err != nil {
			s.log.Warn("install site key", "err", err)
		}
	}
	current := kr.GetPrimaryKey()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grace != nil {
		s.grace.Stop()
		s.grace = nil
	}
	if grace && !bytes.Equal(current, keys[0]) && containsKey(keys, current) {
		s.grace = time.AfterFunc(s.cfg.KeyGrace, func() {
			s.mu.Lock()
			latest := s.keys
			s.mu.Unlock()
			s.useKeys(latest)
		})
		return
	}
	s.useKeysLocked(kr, keys)
}

func (s *Site) useKeys(keys [][]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.useKeysLocked(s.keyring, keys)
}

// useKeysLocked makes keys[0] the primary key and removes unlisted keys.
func (s *Site) useKeysLocked(kr *memberlist.Keyring, keys [][]byte) {
	if err := kr.UseKey(keys[0]); err != nil {
		s.log.Warn("use site key", "err", err)
		return
	}
	for _, k := range slices.Clone(kr.GetKeys()) {
		if !containsKey(keys, k) {
			if err := kr.RemoveKey(k); err != nil {
				s.log.Warn("remove site key", "err", err)
			}
		}
	}
}

func containsKey(keys [][]byte, k []byte) bool {
	return slices.ContainsFunc(keys, func(o []byte) bool { return bytes.Equal(o, k) })
}

// gate wraps memberlist's transport and drops, before memberlist reads
// them, the packets and streams that no installed key opens, counting
// them: memberlist itself only logs them.
type gate struct {
	memberlist.Transport
	keyring *memberlist.Keyring
	ciphers atomic.Pointer[keyCiphers]
	dropped *atomic.Uint64
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	once    sync.Once
}

// Message framing of memberlist (net.go, security.go): an encrypted stream
// starts with the message type encryptMsg and a big-endian uint32 length;
// an encrypted payload is a version byte (0 or 1), a 12-byte nonce, the
// ciphertext and a 16-byte tag.
const (
	encryptMsg        = 10
	maxStreamBytes    = 20 << 20
	nonceSize         = 12
	minEncryptedBytes = 1 + nonceSize + 16
	streamReadTimeout = 5 * time.Second
)

func newGate(inner memberlist.Transport, kr *memberlist.Keyring, dropped *atomic.Uint64) *gate {
	g := &gate{
		Transport: inner,
		keyring:   kr,
		dropped:   dropped,
		packets:   make(chan *memberlist.Packet),
		streams:   make(chan net.Conn),
		done:      make(chan struct{}),
	}
	go g.pumpPackets()
	go g.pumpStreams()
	return g
}

func (g *gate) PacketCh() <-chan *memberlist.Packet { return g.packets }

func (g *gate) StreamCh() <-chan net.Conn { return g.streams }

// Shutdown stops the pumps and the wrapped transport. The wrapped
// transport's listeners block handing over what they read until someone
// takes it, and its Shutdown waits for them, so whatever still arrives is
// drained and dropped until it returns.
func (g *gate) Shutdown() error {
	g.once.Do(func() { close(g.done) })
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			select {
			case <-stop:
				return
			case <-g.Transport.PacketCh():
			case c := <-g.Transport.StreamCh():
				_ = c.Close()
			}
		}
	}()
	err := g.Transport.Shutdown()
	close(stop)
	<-drained
	return err
}

func (g *gate) pumpPackets() {
	// The opened plaintext is not kept: one buffer serves every packet.
	scratch := make([]byte, 0, maxPacket)
	for {
		select {
		case <-g.done:
			return
		case p := <-g.Transport.PacketCh():
			if !opens(g.aeads(), p.Buf, nil, scratch) {
				g.dropped.Add(1)
				continue
			}
			select {
			case g.packets <- p:
			case <-g.done:
				return
			}
		}
	}
}

func (g *gate) pumpStreams() {
	for {
		select {
		case <-g.done:
			return
		case c := <-g.Transport.StreamCh():
			go g.checkStream(c)
		}
	}
}

// checkStream reads the stream's first message and passes the stream on
// only if it is encrypted under an installed key.
func (g *gate) checkStream(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(streamReadTimeout))
	r := bufio.NewReader(c)
	head := make([]byte, 5)
	if _, err := io.ReadFull(r, head[:1]); err != nil {
		_ = c.Close()
		return
	}
	if head[0] != encryptMsg {
		g.dropped.Add(1)
		_ = c.Close()
		return
	}
	if _, err := io.ReadFull(r, head[1:]); err != nil {
		_ = c.Close()
		return
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n > maxStreamBytes {
		g.dropped.Add(1)
		_ = c.Close()
		return
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		_ = c.Close()
		return
	}
	if !opens(g.aeads(), body, head, nil) {
		g.dropped.Add(1)
		_ = c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	pc := &prefixConn{Conn: c, r: io.MultiReader(bytes.NewReader(head), bytes.NewReader(body), r)}
	select {
	case g.streams <- pc:
	case <-g.done:
		_ = c.Close()
	}
}

// keyCiphers are the AES-GCM ciphers of a set of keys.
type keyCiphers struct {
	keys  [][]byte
	aeads []cipher.AEAD
}

// aeads returns the ciphers of the keyring's keys, made again only when
// the keys change: a key schedule per packet cost more than opening it.
func (g *gate) aeads() []cipher.AEAD {
	keys := g.keyring.GetKeys()
	if c := g.ciphers.Load(); c != nil && slices.EqualFunc(c.keys, keys, bytes.Equal) {
		return c.aeads
	}
	c := &keyCiphers{keys: keys}
	for _, k := range keys {
		block, err := aes.NewCipher(k)
		if err != nil {
			continue
		}
		gcm, err := cipher.NewGCM(block)
		if err != nil {
			continue
		}
		c.aeads = append(c.aeads, gcm)
	}
	g.ciphers.Store(c)
	return c.aeads
}

// opens reports whether one of aeads opens the encrypted payload msg with
// the additional data ad; the plaintext goes to scratch's storage when it
// fits.
func opens(aeads []cipher.AEAD, msg, ad, scratch []byte) bool {
	if len(msg) < minEncryptedBytes || msg[0] > 1 {
		return false
	}
	for _, a := range aeads {
		if _, err := a.Open(scratch[:0], msg[1:1+nonceSize], msg[1+nonceSize:], ad); err == nil {
			return true
		}
	}
	return false
}

// prefixConn is a stream whose first bytes were already read.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixConn) Read(p []byte) (int, error) { return c.r.Read(p) }
