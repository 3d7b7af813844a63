// Package memtrim hands back to the operating system the memory a tether
// process needed only for a while.
//
// Start-up of a tether process (package initialization of every linked
// library, scheme registration, the first LIST and WATCH of its informers;
// OpenAPI generation in the hub, adoption and start of the node's pods in
// the agent) touches far more memory than the process needs once it idles:
// code and read-only data of the executable that runs once, and heap
// garbage the collector frees but the runtime keeps mapped for reuse. A
// burst of work later (an agent starting fifty pods) does the same on a
// smaller scale. Release hands both back: it collects garbage, returns the
// free heap to the kernel and pages the executable's resident pages out, so
// that what the process runs next comes back one page at a time, read from
// the disk: only what it uses.
//
// A Trimmer decides when: once the process has settled after start-up,
// and, when asked, again each time it has gone quiet after a burst.
package memtrim
