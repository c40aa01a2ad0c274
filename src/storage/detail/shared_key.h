#pragma once

// Azure Storage Shared Key signing and the encodings it needs.
//
// A request is signed with HMAC-SHA256, keyed by the base64-decoded account
// key, over (Blob service, version 2009-09-19 and later):
//
//   VERB \n Content-Encoding \n Content-Language \n Content-Length \n
//   Content-MD5 \n Content-Type \n Date \n If-Modified-Since \n If-Match \n
//   If-None-Match \n If-Unmodified-Since \n Range \n
//   CanonicalizedHeaders CanonicalizedResource
//
// Content-Length is empty when zero. CanonicalizedHeaders: every x-ms-*
// header, name lower-cased, sorted, "name:value\n". CanonicalizedResource:
// "/" account, the request's encoded path, then per query parameter sorted by
// name "\nname:value" with the value decoded. The header is
// "Authorization: SharedKey <account>:<base64 signature>".

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cohort/core/base64.h"
#include "core/detail/http.h"

namespace cohort::storage::detail {

// The HTTP client is core's (core/detail/http.h).
using namespace cohort::http;
using cohort::base64Decode;
using cohort::base64Encode;

using Query = std::vector<std::pair<std::string, std::string>>;  // decoded names and values

std::string hmacSha256(const std::string& key, const std::string& message);

// Percent-encodes all but RFC 3986 unreserved characters (and '/' with
// keepSlash, for paths).
std::string percentEncode(const std::string& s, bool keepSlash = false);
std::string percentDecode(const std::string& s);
// "name=value&..." with names and values percent-encoded.
std::string encodeQuery(const Query& query);

// The current time as an HTTP date: "Sun, 22 Nov 2026 00:55:45 GMT".
std::string httpDate();

// The string to sign for `method` on `encodedPath` (as sent, starting with
// '/'), with `headers` (x-ms-* and standard ones; case-insensitive) and a body
// of `contentLength` bytes.
std::string sharedKeyStringToSign(const std::string& account, const std::string& method,
                                  const std::string& encodedPath, const Query& query,
                                  const Headers& headers, int64_t contentLength);

// The Authorization header's value. `key` is the decoded account key.
std::string sharedKeyAuthorization(const std::string& account, const std::string& key,
                                   const std::string& stringToSign);

}  // namespace cohort::storage::detail
