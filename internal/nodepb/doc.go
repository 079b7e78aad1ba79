// Package nodepb is the generated code of Quill's node-to-node services
// (proto/quill/v1/*.proto): one service per manager of Porcupine Fig. 2 —
// UserManager (§2.2, §3.3), Writer (Neptune level 2), Replica (§4.2-4.4),
// Fragment (the mailbox manager's remote access, §2.2). Both ends of every
// call use these types, so the compiler checks them; message bodies travel
// as bytes, once. Regenerate with `make proto`; CI fails when it is stale.
// Only the domain packages' pb.go files convert to and from these types.
package nodepb
