#pragma once

// Addresses, as the servers cohort runs decide whether to ask for a token,
// and this machine's name.

#include <optional>
#include <string>

namespace cohort {

// True for 127.0.0.0/8, ::1 (bracketed or not) and "localhost": addresses
// only this machine reaches.
bool isLoopbackAddress(const std::string& host);

// The address of this machine that packets to `host` leave from (the route
// the kernel picks; nothing is sent), or nullopt when `host` does not resolve
// or no route reaches it.
std::optional<std::string> localAddressTowards(const std::string& host, int port);

// A TCP port no socket of this machine holds now (bound on every address,
// then released), for a server about to start here. It is picked at random
// below the kernel's ephemeral range, where neither outgoing connections nor
// other programs' "any port" binds land before the server binds it. Throws
// IoError.
int freeTcpPort();

// This machine's host name (gethostname); "unknown" when it has none.
std::string hostName();

}  // namespace cohort
