package cassandra

// Profiles (userdb.Profile): the users table, partitioned by the address's
// user-map bucket and a shard of it.

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/userdb"
)

// userShards is how many partitions each of the 256 buckets' users are
// spread over: a bucket's scan reads this many partitions, and a partition
// holds about users/(256*userShards) profiles (40 for a million users).
const userShards = 16

// userPartition returns the partition of an address: its user-map bucket
// (cluster.Bucket) and a shard from the top bits of another hash of it.
func userPartition(addr string) (bucket, shard int16) {
	h := fnv.New64a()
	h.Write([]byte(strings.ToLower(addr)))
	// The top bits: FNV's low bits follow the input's low bits alone, so
	// within one bucket (FNV-32's low 8 bits) they would hardly vary.
	return int16(cluster.Bucket(addr)), int16(h.Sum64() >> 60 % userShards)
}

// PutProfile writes a profile, newest version winning: the write's
// timestamp is the profile's HLC version, so an older version written later
// (a stale writer, a retried request) changes nothing. A deleted user is a
// profile with Deleted set, as in the native store, so a late update cannot
// bring it back.
func (st *Store) PutProfile(ctx context.Context, p *userdb.Profile) error {
	addr := userdb.Normalize(p.Address)
	if err := userdb.ValidateAddress(addr); err != nil {
		return err
	}
	ts, err := stamped("user "+addr, uint64(p.Version))
	if err != nil {
		return err
	}
	c := p.Clone()
	c.Address = addr
	data, err := c.Encode()
	if err != nil {
		return fmt.Errorf("user %s: encode profile: %w", addr, err)
	}
	b, sh := userPartition(addr)
	if err := st.write(ctx, `INSERT INTO users (bucket, shard, address, version, deleted, profile) VALUES (?, ?, ?, ?, ?, ?)
		USING TIMESTAMP ?`, b, sh, addr, ts, c.Deleted, data, ts).Exec(); err != nil {
		return fmt.Errorf("user %s: write profile: %w", addr, err)
	}
	return nil
}

// Profile returns the profile of addr (a deleted user's tombstone too:
// Deleted tells), or an error wrapping userdb.ErrNotFound.
func (st *Store) Profile(ctx context.Context, addr string) (*userdb.Profile, error) {
	addr = userdb.Normalize(addr)
	b, sh := userPartition(addr)
	var data []byte
	err := st.read(ctx, `SELECT profile FROM users WHERE bucket = ? AND shard = ? AND address = ?`, b, sh, addr).Scan(&data)
	if notFound(err) {
		return nil, fmt.Errorf("user %s: %w", addr, userdb.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("user %s: read profile: %w", addr, err)
	}
	p, err := userdb.Decode(data)
	if err != nil {
		return nil, fmt.Errorf("user %s: corrupt profile: %w", addr, err)
	}
	return p, nil
}

// DeleteProfile removes a profile for good (purging a tombstone): every
// write stamped before version is gone, and later ones are kept.
func (st *Store) DeleteProfile(ctx context.Context, addr string, version uint64) error {
	addr = userdb.Normalize(addr)
	ts, err := stamped("user "+addr, version)
	if err != nil {
		return err
	}
	b, sh := userPartition(addr)
	if err := st.write(ctx, `DELETE FROM users USING TIMESTAMP ? WHERE bucket = ? AND shard = ? AND address = ?`,
		ts, b, sh, addr).Exec(); err != nil {
		return fmt.Errorf("user %s: delete profile: %w", addr, err)
	}
	return nil
}

// ScanProfiles calls fn for every profile in a user-map bucket (tombstones
// included), shard by shard: the user manager's rebuild of the bucket's
// soft state (Porcupine §3.3) without a scan of the whole table.
func (st *Store) ScanProfiles(ctx context.Context, bucket int, fn func(*userdb.Profile) error) error {
	if bucket < 0 || bucket >= cluster.Buckets {
		return fmt.Errorf("bucket %d: want 0 to %d", bucket, cluster.Buckets-1)
	}
	for sh := int16(0); sh < userShards; sh++ {
		q := st.read(ctx, `SELECT address, profile FROM users WHERE bucket = ? AND shard = ?`, int16(bucket), sh)
		if err := eachProfile(q, fmt.Sprintf("bucket %d", bucket), fn); err != nil {
			return err
		}
	}
	return nil
}

// AllProfiles calls fn for every profile in the keyspace (tombstones
// included), in token order, a page at a time: one paged scan of the
// table, where reading bucket by bucket would be 4,096 partition reads
// (quill migrate, which reads everything).
func (st *Store) AllProfiles(ctx context.Context, fn func(*userdb.Profile) error) error {
	return eachProfile(st.read(ctx, `SELECT address, profile FROM users`), "all users", fn)
}

// eachProfile decodes the profiles q's rows (address, profile) hold and
// calls fn for each, page by page; what names the scan in errors.
func eachProfile(q *gocql.Query, what string, fn func(*userdb.Profile) error) error {
	it := q.Iter()
	var addr string
	var data []byte
	for it.Scan(&addr, &data) {
		p, err := userdb.Decode(data)
		if err != nil {
			it.Close()
			return fmt.Errorf("user %s: corrupt profile: %w", addr, err)
		}
		if err := fn(p); err != nil {
			it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("%s: scan profiles: %w", what, err)
	}
	return nil
}
