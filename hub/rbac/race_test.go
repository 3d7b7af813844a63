//go:build race

package rbac

const raceEnabled = true
