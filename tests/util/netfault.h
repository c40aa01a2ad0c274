#pragma once

// Faults on the links of a TestNetwork's hosts, as a real network has them.
// This kernel has no netem qdisc, so each fault is made with what it has:
//
//   loss        nftables in the host's namespace: `numgen random mod 100 <
//               P drop` on what the host sends and on what it receives (P%
//               of the packets crossing its link, each way; host to host
//               crosses two links)
//   rate        tc's tbf on both ends of the host's veth (its upload and
//               its download)
//   latency     a transparent TCP relay in the host's namespace
//               (util/delay_relay.cc): nftables redirects every TCP
//               connection the host opens toward the subnet to it, and it
//               holds each direction's bytes for the delay. Only TCP, and
//               only connections opened after the relay was put in place;
//               the delay of those can be changed at any time, and 0 keeps
//               them relayed
//   partition   nftables drops every packet to and from the host but its
//               own loopback: no connection is reset, nothing gets through
//               until heal()
//
// Everything is undone by the destructor (the namespaces' rules go with
// them; the relays are child processes, SIGKILLed and reaped).

#include <memory>
#include <string>
#include <vector>

#include "util/netns.h"
#include "util/process.h"

namespace cohort::test {

class LinkFaults {
 public:
  explicit LinkFaults(const TestNetwork& net);
  ~LinkFaults();
  LinkFaults(const LinkFaults&) = delete;
  LinkFaults& operator=(const LinkFaults&) = delete;

  // Drops `percent` (0..100) of the packets that cross host's link, each
  // way; 0: none.
  void loss(int host, int percent);
  // Limits host's link to `rate` each way (tc syntax: "50mbit"); "": no
  // limit.
  void rate(int host, const std::string& rate);
  // Puts the relay in front of every TCP connection host opens from now on
  // (delay 0 until latency() says otherwise).
  void relay(int host);
  // Adds `ms` of latency to each direction of the relayed connections of
  // host (relay() first if it has none).
  void latency(int host, int ms);
  // Nothing reaches host or leaves it until heal(host).
  void partition(int host);
  void heal(int host);
  bool partitioned(int host) const;
  // Every fault on every host removed (the relays stay, at delay 0).
  void clear();

  // What is in place on host, for logs ("loss 1%, rate 50mbit, ...").
  std::string describe(int host) const;

  // Evidence that the faults act: packets host's rules dropped since they
  // last changed, and connections its relay carried.
  int64_t dropped(int host) const;
  int relayed(int host) const;

 private:
  struct Host {
    int lossPercent = 0;
    std::string rate;
    bool partitioned = false;
    int latencyMs = 0;
    std::unique_ptr<Process> relay;
  };
  // Rewrites host's nftables rules from its state, in one transaction.
  void apply(int host);

  const TestNetwork& net_;
  TempDir dir_;
  std::vector<Host> hosts_;
};

}  // namespace cohort::test
