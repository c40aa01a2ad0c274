// cohort's rendezvous store (cohort/comm/store.h): the table's semantics,
// the address it binds, and the token every connection must prove.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "cohort/comm/comm.h"
#include "cohort/comm/store.h"
#include "cohort/core/error.h"
#include "comm/detail/store_wire.h"
#include "util/errors.h"

namespace cohort {
namespace {

using comm::KeyValueTable;
using std::chrono::milliseconds;

const std::string kToken = "0123456789abcdef0123456789abcdef";

TEST(StoreTable, KeepsC10dSemantics) {
  KeyValueTable t;
  EXPECT_FALSE(t.get("a", milliseconds(10)).has_value());
  t.set("a", "1");
  EXPECT_EQ(t.get("a", milliseconds(10)).value(), "1");
  EXPECT_EQ(t.add("n", 5), 5);
  EXPECT_EQ(t.add("n", -2), 3);
  EXPECT_EQ(t.get("n", milliseconds(10)).value(), "3");
  t.set("s", "abc");
  EXPECT_THROW(t.add("s", 1), std::invalid_argument);
  // compareSet: an absent key with an empty expected value takes the new one;
  // a wrong expected value leaves the key alone.
  EXPECT_EQ(t.compareSet("c", "", "x"), "x");
  EXPECT_EQ(t.compareSet("c", "y", "z"), "x");
  EXPECT_EQ(t.compareSet("c", "x", "z"), "z");
  EXPECT_EQ(t.compareSet("absent", "y", "z"), "y");
  EXPECT_FALSE(t.check({"absent"}));
  EXPECT_TRUE(t.check({"a", "n", "c"}));
  EXPECT_EQ(t.size(), 4);
  EXPECT_TRUE(t.erase("a"));
  EXPECT_FALSE(t.erase("a"));
  EXPECT_EQ(t.size(), 3);
  EXPECT_FALSE(t.wait({"n", "never"}, milliseconds(10)));
}

TEST(StoreTable, WaitingReadsWakeOnASetAndOnStop) {
  KeyValueTable t;
  std::optional<std::string> got;
  std::thread reader([&] { got = t.get("late", milliseconds(60000)); });
  t.set("late", "v");
  reader.join();
  EXPECT_EQ(got.value_or("<timed out>"), "v");

  bool found = true;
  std::thread waiter([&] { found = t.wait({"never"}, milliseconds(0)); });  // no limit
  t.stop();
  waiter.join();  // hangs (and the test times out) if stop() did not wake it
  EXPECT_FALSE(found);
}

// The local address of the listening socket on `port`, from /proc/net/tcp
// (hex, as the kernel prints it): "0100007F" is 127.0.0.1, "00000000" any.
std::string listeningAddress(int port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    const size_t colon = local.find(':');
    if (state == "0A" && std::stoi(local.substr(colon + 1), nullptr, 16) == port) {
      return local.substr(0, colon);
    }
  }
  return "<not listening>";
}

TEST(StoreServer, ListensOnTheAddressItIsGivenOnly) {
  comm::StoreServerOptions o;
  o.addr = "127.0.0.1";
  comm::StoreServer loopback(o);
  EXPECT_EQ(listeningAddress(loopback.port()), "0100007F");
  // Control: the check tells an address bound to every interface apart.
  o.addr = "0.0.0.0";
  o.token = kToken;
  comm::StoreServer any(o);
  EXPECT_EQ(listeningAddress(any.port()), "00000000");
}

TEST(StoreServer, BeyondLoopbackWithoutATokenIsRefused) {
  comm::StoreServerOptions o;
  o.addr = "0.0.0.0";
  try {
    comm::StoreServer s(o);
    FAIL() << "a store without a token listened on 0.0.0.0";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("COHORT_STORE_TOKEN"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("0.0.0.0"), std::string::npos) << e.what();
  }
}

comm::Comm clientOf(int port, const std::string& token) {
  comm::Comm c;
  c.masterAddr = "127.0.0.1";
  c.masterPort = port;
  c.storeToken = token;
  c.storePrefix = "test";
  c.timeout = milliseconds(10000);
  return c;
}

TEST(StoreServer, ClientsWithTheTokenReadAndWriteTheHostsTable) {
  auto hosted = comm::hostStore("127.0.0.1", 0, milliseconds(10000), kToken);
  auto client = comm::openStoreClient(clientOf(hosted.port, kToken));
  client->set("k", {'v', '1'});
  EXPECT_EQ(hosted.store->get("test/k"), (std::vector<uint8_t>{'v', '1'}));
  hosted.store->set("test/from-host", {'h'});
  EXPECT_EQ(client->get("from-host"), std::vector<uint8_t>{'h'});
  EXPECT_EQ(client->add("count", 2), 2);
  EXPECT_EQ(hosted.store->add("test/count", 3), 5);
  EXPECT_EQ(client->compareSet("cas", {}, {'a'}), std::vector<uint8_t>{'a'});
  EXPECT_TRUE(client->check({"k", "cas"}));
  EXPECT_TRUE(client->deleteKey("cas"));
  EXPECT_FALSE(client->check({"cas"}));
  EXPECT_EQ(client->getNumKeys(), 3);  // k, from-host, count
  const std::string late =
      test::errorOf([&] { client->wait({"never"}, milliseconds(50)); });
  EXPECT_NE(late.find("timed out"), std::string::npos) << late;
  // The connection stays usable after a request timed out on the server.
  EXPECT_EQ(client->get("k"), (std::vector<uint8_t>{'v', '1'}));
}

TEST(StoreServer, AWrongOrMissingTokenIsRefusedAtConnect) {
  auto hosted = comm::hostStore("127.0.0.1", 0, milliseconds(10000), kToken);
  const std::string wrong = test::errorOf(
      [&] { comm::openStoreClient(clientOf(hosted.port, "fedcba9876543210fedcba9876543210")); });
  EXPECT_NE(wrong.find("refused this rank's store token"), std::string::npos) << wrong;
  const std::string missing = test::errorOf([&] { comm::openStoreClient(clientOf(hosted.port, "")); });
  EXPECT_NE(missing.find("requires the job's store token"), std::string::npos) << missing;

  auto open = comm::hostStore("127.0.0.1", 0, milliseconds(10000), "");
  const std::string unexpected =
      test::errorOf([&] { comm::openStoreClient(clientOf(open.port, kToken)); });
  EXPECT_NE(unexpected.find("asks for none"), std::string::npos) << unexpected;
}

// A raw connection, as someone without the token would make it.
int rawConnect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

// Reads until the server closes the connection (true) or 20 s pass (false).
bool closedByPeer(int fd) {
  char buf[256];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20000) <= 0) return false;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
  }
}

TEST(StoreServer, ARequestWithoutTheHandshakeIsNeverServed) {
  comm::StoreServerOptions o;
  o.token = kToken;
  o.handshakeTimeout = milliseconds(200);
  comm::StoreServer server(o);

  // A forged proof, then a request: the verdict is "no" and nothing is set.
  const int forged = rawConnect(server.port());
  std::string hello(16 + 1 + 32, '\0');
  ASSERT_EQ(::recv(forged, hello.data(), hello.size(), MSG_WAITALL),
            static_cast<ssize_t>(hello.size()));
  EXPECT_EQ(hello[16], 1) << "the store did not ask for a token";
  const std::string proof(64, '\x5a');
  ASSERT_EQ(::send(forged, proof.data(), proof.size(), MSG_NOSIGNAL), 64);
  comm::detail::Message set;
  set.code = static_cast<uint8_t>(comm::detail::Op::set);
  set.items = {"owned", "yes"};
  const std::string frame = comm::detail::encode(set);
  ::send(forged, frame.data(), frame.size(), MSG_NOSIGNAL);
  char verdict = 1;
  ASSERT_EQ(::recv(forged, &verdict, 1, MSG_WAITALL), 1);
  EXPECT_EQ(verdict, 0);
  EXPECT_TRUE(closedByPeer(forged));
  ::close(forged);

  // A request sent straight away, as to a TCPStore, is read as a (wrong) proof.
  const int direct = rawConnect(server.port());
  ::send(direct, frame.data(), frame.size(), MSG_NOSIGNAL);
  EXPECT_TRUE(closedByPeer(direct));
  ::close(direct);

  // A client that says nothing is dropped after the handshake timeout.
  const int silent = rawConnect(server.port());
  EXPECT_TRUE(closedByPeer(silent));
  ::close(silent);

  EXPECT_FALSE(server.table().check({"owned"}));
  EXPECT_GE(server.refused(), 1);
}

}  // namespace
}  // namespace cohort
