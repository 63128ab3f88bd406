// Command etcd is the pinned etcd server used by the local development cluster.
// It is a build of go.etcd.io/etcd/server/v3 at the version in go.mod, nothing more.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
