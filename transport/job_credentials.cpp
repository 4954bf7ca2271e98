#include "h2/transport/job_credentials.hpp"

#include "h2/core/error.hpp"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>

namespace h2::transport {

namespace {

template <class T, void (*Free)(T*)>
struct openssl_deleter {
  void operator()(T* p) const { Free(p); }
};

using pkey_ptr =
  std::unique_ptr<EVP_PKEY, openssl_deleter<EVP_PKEY, EVP_PKEY_free>>;
using x509_ptr = std::unique_ptr<X509, openssl_deleter<X509, X509_free>>;
using bio_ptr = std::unique_ptr<BIO, openssl_deleter<BIO, BIO_free_all>>;

void check(bool ok, const char* what) {
  if (!ok)
    throw error(std::string("cannot derive the job's TLS identity: ") + what +
                " failed");
}

std::string pem_of(bool (*write)(BIO*, void*), void* object) {
  bio_ptr bio(BIO_new(BIO_s_mem()));
  check(bio != nullptr, "BIO_new");
  check(write(bio.get(), object), "PEM_write");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  check(size > 0 && data != nullptr, "BIO_get_mem_data");
  return std::string(data, static_cast<std::size_t>(size));
}

/// Sets the names, serial and validity: the same on every node, so that
/// the certificate's bytes are too.
void describe(X509* cert) {
  check(X509_set_version(cert, X509_VERSION_3) == 1, "X509_set_version");
  check(ASN1_INTEGER_set(X509_get_serialNumber(cert), 1) == 1,
        "ASN1_INTEGER_set");
  check(ASN1_TIME_set_string(X509_getm_notBefore(cert), "20000101000000Z") ==
          1,
        "ASN1_TIME_set_string");
  check(ASN1_TIME_set_string(X509_getm_notAfter(cert), "99991231235959Z") ==
          1,
        "ASN1_TIME_set_string");
  X509_NAME* name = X509_get_subject_name(cert);
  const auto* cn = reinterpret_cast<const unsigned char*>("h2 job");
  check(X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, cn, -1, -1, 0) ==
          1,
        "X509_NAME_add_entry_by_txt");
  check(X509_set_issuer_name(cert, name) == 1, "X509_set_issuer_name");
}

} // namespace

tls_credentials derive_tls_credentials(const job_secret& secret) {
  const auto seed = secret.prove("tls/ed25519-key");
  pkey_ptr key(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr,
                                            seed.data(), seed.size()));
  check(key != nullptr, "EVP_PKEY_new_raw_private_key");
  x509_ptr cert(X509_new());
  check(cert != nullptr, "X509_new");
  describe(cert.get());
  check(X509_set_pubkey(cert.get(), key.get()) == 1, "X509_set_pubkey");
  // Ed25519 hashes internally: no digest.
  check(X509_sign(cert.get(), key.get(), nullptr) > 0, "X509_sign");
  tls_credentials out;
  out.certificate_pem = pem_of(
    [](BIO* b, void* x) {
      return PEM_write_bio_X509(b, static_cast<X509*>(x)) == 1;
    },
    cert.get());
  out.key_pem = pem_of(
    [](BIO* b, void* k) {
      return PEM_write_bio_PrivateKey(b, static_cast<EVP_PKEY*>(k), nullptr,
                                      nullptr, 0, nullptr, nullptr) == 1;
    },
    key.get());
  return out;
}

} // namespace h2::transport
