#pragma once

// Addresses, as the servers cohort runs decide whether to ask for a token,
// and this machine's name.

#include <string>

namespace cohort {

// True for 127.0.0.0/8, ::1 (bracketed or not) and "localhost": addresses
// only this machine reaches.
bool isLoopbackAddress(const std::string& host);

// This machine's host name (gethostname); "unknown" when it has none.
std::string hostName();

}  // namespace cohort
