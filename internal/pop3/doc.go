// Package pop3 is Quill's POP3 retrieval proxy: the front end that lets a
// mail client log in, list, fetch and delete the messages in its INBOX.
//
// It implements the POP3 proxy of the Porcupine paper (§2.3.2). The proxy
// holds no mail itself: it authenticates through, and reads the user's
// mailbox fragments from, a Backend, so any node can serve any user. Only
// the protocol lives here: RFC 1939 (POP3), RFC 2449 (CAPA and extended
// response codes), RFC 3206 ([AUTH] and [SYS/TEMP]) and RFC 5034 (AUTH, with
// the RFC 4616 PLAIN mechanism). APOP is not offered.
//
// Deletions follow RFC 1939 §6: DELE only marks a message, and the marks are
// handed to Maildrop.Delete at QUIT; a session that ends any other way
// (dropped connection, idle timeout, shutdown) removes nothing.
package pop3
