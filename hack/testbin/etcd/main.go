// Command etcd is upstream etcd's server entry point (go.etcd.io/etcd/server/v3/etcdmain) at a pinned
// release, built from the Go module proxy so the local control plane needs no download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
