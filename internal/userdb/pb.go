package userdb

// Profiles on the wire and on disk: the protobuf Profile of
// proto/quill/v1/common.proto, in updates of the replication manager, in
// the user manager's service and as the record this database keeps.
// Records and updates written before it are JSON, which Decode still reads.

import (
	"encoding/json"

	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/nodepb"
	"google.golang.org/protobuf/proto"
)

// ToPB converts a profile for the wire.
func (p *Profile) ToPB() *nodepb.Profile {
	out := &nodepb.Profile{Address: p.Address, PasswordHash: p.PasswordHash, Created: nodepb.Nanos(p.Created),
		Updated: nodepb.Nanos(p.Updated), Version: uint64(p.Version), Deleted: p.Deleted, Spread: int32(p.Spread),
		Replicas: int32(p.Replicas), WritePolicy: p.WritePolicy, LastUidValidity: p.LastUIDValidity, ScramSha256: p.SCRAMSHA256,
		Subscriptions: p.Subscriptions, QuotaStorage: p.QuotaStorage, QuotaMessages: p.QuotaMessages, Admin: p.Admin}
	for _, d := range p.Mailboxes {
		out.Mailboxes = append(out.Mailboxes, &nodepb.MailboxDef{Name: d.Name, UidValidity: d.UIDValidity,
			Subscribed: d.Subscribed, SpecialUse: d.SpecialUse, UidReserved: d.UIDReserved, ModSeqReserved: d.ModSeqReserved})
	}
	return out
}

// ProfileFromPB converts a profile from the wire (nil for nil).
func ProfileFromPB(p *nodepb.Profile) *Profile {
	if p == nil {
		return nil
	}
	out := &Profile{Address: p.Address, PasswordHash: p.PasswordHash, Created: nodepb.Time(p.Created),
		Updated: nodepb.Time(p.Updated), Version: hlc.Timestamp(p.Version), Deleted: p.Deleted, Spread: int(p.Spread),
		Replicas: int(p.Replicas), WritePolicy: p.WritePolicy, LastUIDValidity: p.LastUidValidity, SCRAMSHA256: p.ScramSha256,
		Subscriptions: p.Subscriptions, QuotaStorage: p.QuotaStorage, QuotaMessages: p.QuotaMessages, Admin: p.Admin}
	for _, d := range p.Mailboxes {
		out.Mailboxes = append(out.Mailboxes, MailboxDef{Name: d.Name, UIDValidity: d.UidValidity,
			Subscribed: d.Subscribed, SpecialUse: d.SpecialUse, UIDReserved: d.UidReserved, ModSeqReserved: d.ModSeqReserved})
	}
	return out
}

// Encode returns a profile as a record and as an update's data.
func (p *Profile) Encode() ([]byte, error) { return proto.Marshal(p.ToPB()) }

// Decode reads an encoded profile: protobuf, or the JSON of records and
// updates from before (a JSON object starts with '{', which no protobuf
// encoding of a Profile does).
func Decode(b []byte) (*Profile, error) {
	if len(b) > 0 && b[0] == '{' {
		var p Profile
		if err := json.Unmarshal(b, &p); err != nil {
			return nil, err
		}
		return &p, nil
	}
	var pb nodepb.Profile
	if err := proto.Unmarshal(b, &pb); err != nil {
		return nil, err
	}
	return ProfileFromPB(&pb), nil
}
