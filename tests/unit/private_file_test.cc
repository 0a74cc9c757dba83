#include "base/private_file.h"
#include "http/tcp_tls.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using xdpq::open_private_output;

namespace {
class PrivateFile : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("xdpq-private-" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};
} // namespace

// Regression: keylog and capture files followed symlinks and
// were created 0644.
TEST_F(PrivateFile, CreatedOwnerOnly) {
  std::string why;
  auto p = (dir_ / "keys.log").string();
  int fd = open_private_output(p, false, &why);
  ASSERT_GE(fd, 0) << why;
  close(fd);
  struct stat st {};
  ASSERT_EQ(stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(PrivateFile, SymlinksAreRefusedAndTheirTargetUntouched) {
  auto target = dir_ / "shadow";
  std::ofstream(target) << "precious";
  fs::permissions(target, fs::perms::owner_read | fs::perms::owner_write);
  fs::create_symlink(target, dir_ / "link");
  std::string why;
  EXPECT_EQ(open_private_output((dir_ / "link").string(), true, &why), -1);
  EXPECT_NE(why.find("symbolic link"), std::string::npos) << why;
  std::ifstream in(target);
  std::string content;
  in >> content;
  EXPECT_EQ(content, "precious");
}

// Regression: O_NOFOLLOW stops symbolic links only. A hard link to a
// private file of ours (as root: a host key, where hard links are not
// protected) put where a capture or key log was to go was truncated.
TEST_F(PrivateFile, HardLinksAreRefusedAndTheirTargetUntouched) {
  auto target = dir_ / "host_key";
  std::ofstream(target) << "precious";
  fs::permissions(target, fs::perms::owner_read | fs::perms::owner_write);
  fs::create_hard_link(target, dir_ / "capture.pcap");
  std::string why;
  EXPECT_EQ(open_private_output((dir_ / "capture.pcap").string(), true, &why), -1);
  EXPECT_NE(why.find("hard links"), std::string::npos) << why;
  EXPECT_EQ(fs::file_size(target), 8u);
}

TEST_F(PrivateFile, ExistingFileMustBePrivateAndIsNotTruncatedWhenRefused) {
  auto p = dir_ / "open.pcap";
  std::ofstream(p) << "keep me";
  fs::permissions(p, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                         fs::perms::others_read);
  std::string why;
  EXPECT_EQ(open_private_output(p.string(), true, &why), -1);
  EXPECT_NE(why.find("0644"), std::string::npos) << why;
  EXPECT_EQ(fs::file_size(p), 7u);
  fs::permissions(p, fs::perms::owner_read | fs::perms::owner_write);
  int fd = open_private_output(p.string(), true, &why);
  ASSERT_GE(fd, 0) << why;
  close(fd);
  EXPECT_EQ(fs::file_size(p), 0u); // truncated once accepted
  // A FIFO or directory is not a file to write secrets into.
  ASSERT_EQ(mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  EXPECT_EQ(open_private_output((dir_ / "fifo").string(), false, &why), -1);
}

// Regression: a capture or key log named after another file of ours
// truncated it or wrote into it: `xdpqctl capture start` with the path of
// the QUIC secrets file destroyed the secrets. An existing file that is
// not empty must be of the kind written.
TEST_F(PrivateFile, AnExistingFileOfAnotherKindIsRefusedAndUntouched) {
  static constexpr std::string_view KIND[] = {"CLIENT_", "#"};
  auto p = dir_ / "secrets";
  std::ofstream(p) << "precious";
  fs::permissions(p, fs::perms::owner_read | fs::perms::owner_write);
  std::string why;
  EXPECT_EQ(open_private_output(p.string(), true, &why, KIND, "a key log"), -1);
  EXPECT_NE(why.find("exists and is not a key log"), std::string::npos) << why;
  EXPECT_EQ(open_private_output(p.string(), false, &why, KIND, "a key log"), -1);
  EXPECT_EQ(fs::file_size(p), 8u);
  // Its own kind, or nothing yet: taken.
  std::ofstream(p) << "CLIENT_RANDOM 00 00\n";
  int fd = open_private_output(p.string(), false, &why, KIND, "a key log");
  ASSERT_GE(fd, 0) << why;
  close(fd);
  std::ofstream(p).close(); // emptied
  fd = open_private_output(p.string(), true, &why, KIND, "a key log");
  ASSERT_GE(fd, 0) << why;
  close(fd);
}

// Regression: the OpenSSL ticket key's AES half repeated the key
// name, which every ticket carries in the clear.
TEST(TicketKeys, NameSharesNoBytesWithTheKeys) {
  std::array<uint8_t, 64> secret{};
  for (size_t i = 0; i < secret.size(); ++i)
    secret[i] = static_cast<uint8_t>(i * 13 + 1);
  auto k = xdpq::http::derive_ticket_keys(secret);
  const uint8_t *name = k.data();
  for (size_t off = 16; off + 4 <= k.size(); ++off) {
    EXPECT_NE(std::memcmp(name, k.data() + off, 4), 0) << "name bytes reappear at " << off;
  }
  EXPECT_EQ(k, xdpq::http::derive_ticket_keys(secret)); // every worker, every restart
  secret[63] ^= 1;
  auto k2 = xdpq::http::derive_ticket_keys(secret);
  for (size_t part : {0u, 16u, 48u}) {
    EXPECT_NE(std::memcmp(k.data() + part, k2.data() + part, 16), 0) << part;
  }
}

#include "quic/secrets.h"

// Regression: the secrets file's owner was not checked: whoever
// owns it can swap the keys.
TEST_F(PrivateFile, SecretsFileMustBeOursOrRoots) {
  auto p = (dir_ / "secrets").string();
  xdpq::quic::Secrets::load_or_create(p); // created 0600, ours
  EXPECT_NO_THROW(xdpq::quic::Secrets::load_or_create(p));
  if (geteuid() != 0) {
    const char *ci = getenv("CI");
    if (ci && std::string(ci) == "true")
      FAIL() << "needs root (chown to another user)";
    GTEST_SKIP() << "chown to another user needs root";
  }
  ASSERT_EQ(chown(p.c_str(), 65534, 65534), 0); // nobody
  try {
    xdpq::quic::Secrets::load_or_create(p);
    FAIL() << "accepted a secrets file owned by nobody";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find("owned by uid 65534"), std::string::npos) << e.what();
  }
}

// QUIC-LB: the secrets file carries the balancer's AES key; new
// files get one, files of older versions load without it, and a malformed
// one names its line.
TEST_F(PrivateFile, SecretsFileCarriesTheQuicLbKey) {
  auto p = (dir_ / "secrets").string();
  auto made = xdpq::quic::Secrets::load_or_create(p);
  ASSERT_TRUE(made.quic_lb_key.has_value());
  auto again = xdpq::quic::Secrets::load_or_create(p);
  EXPECT_EQ(again.quic_lb_key, made.quic_lb_key);
  EXPECT_EQ(again.reset_key, made.reset_key);

  auto write = [&](const std::string &text) {
    fs::remove(p);
    int fd = open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    close(fd);
  };
  const std::string keys = "reset_key=" + std::string(64, '1') + "\ntoken_key=" +
                           std::string(64, '2') + "\nticket_key=" + std::string(128, '3') + "\n";
  write(keys);
  EXPECT_FALSE(xdpq::quic::Secrets::load_or_create(p).quic_lb_key.has_value());
  write(keys + "quic_lb_key=8f95f09245765f80256934e50c66207f\n");
  auto lb = xdpq::quic::Secrets::load_or_create(p).quic_lb_key;
  ASSERT_TRUE(lb.has_value());
  EXPECT_EQ((*lb)[0], 0x8f);
  EXPECT_EQ((*lb)[15], 0x7f);
  write(keys + "quic_lb_key=8f95f0\n");
  try {
    xdpq::quic::Secrets::load_or_create(p);
    FAIL() << "accepted a short quic_lb_key";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find(":4: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("quic_lb_key=<32 hex>"), std::string::npos) << e.what();
  }
}
