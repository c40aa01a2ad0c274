#pragma once

// Addresses, as the servers cohort runs decide whether to ask for a token.

#include <string>

namespace cohort {

// True for 127.0.0.0/8, ::1 (bracketed or not) and "localhost": addresses
// only this machine reaches.
bool isLoopbackAddress(const std::string& host);

}  // namespace cohort
