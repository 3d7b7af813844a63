package pki

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSealKeys(t *testing.T) {
	k, err := GenerateKeys(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte(strings.Repeat("s", MinSecretKeyLength))
	sealed, err := k.Seal(secret, "cluster-a")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("PRIVATE KEY")) {
		t.Fatal("sealed keys hold a key in clear")
	}
	got, err := OpenKeys(sealed, secret, "cluster-a")
	if err != nil || !got.Equal(k) {
		t.Fatalf("open sealed keys: %v, equal %v", err, err == nil && got.Equal(k))
	}
	other := []byte(strings.Repeat("t", MinSecretKeyLength))
	if _, err := OpenKeys(sealed, other, "cluster-a"); !errors.Is(err, ErrWrongSecretKey) {
		t.Fatalf("open with another secret: %v", err)
	}
	if _, err := OpenKeys(sealed, secret, "cluster-b"); !errors.Is(err, ErrWrongSecretKey) {
		t.Fatalf("open for another cluster: %v", err)
	}
	if _, err := k.Seal(secret[:MinSecretKeyLength-1], "cluster-a"); err == nil {
		t.Fatal("a short secret was accepted")
	}
}

// TestAuthorityFromKeys: an authority given keys writes them to its
// directory, uses them, and ReadKeys reads them back.
func TestAuthorityFromKeys(t *testing.T) {
	k, err := GenerateKeys(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if got, err := ReadKeys(dir); got != nil || err != nil {
		t.Fatalf("ReadKeys of an empty directory: %v, %v", got, err)
	}
	a, err := LoadOrCreate(Config{Dir: dir, Keys: k})
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := k.CAHash(); a.CAHash() != id {
		t.Fatalf("authority CA %s, keys' %s", a.CAHash(), id)
	}
	if _, err := a.FrontProxy(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ServiceAccountKey(); err != nil {
		t.Fatal(err)
	}
	got, err := ReadKeys(dir)
	if err != nil || !got.Equal(k) {
		t.Fatalf("ReadKeys after LoadOrCreate: %v", err)
	}
	// A directory with only some keys but no CA is refused.
	only := t.TempDir()
	if err := os.MkdirAll(filepath.Join(only, "pki"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(only, "pki", "sa.key"), k.ServiceAccountKey, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadKeys(only); err == nil {
		t.Fatal("ReadKeys accepted keys without a CA")
	}
}
