// The fake fabric behind fake_verbs.hpp. Every function below replaces the
// rdma-core function of the same name in test_transport_rdma_emulated (the
// executable's own definitions win over the shared libraries'); the
// operations verbs.h inlines (post, poll, arm) go through the fake device
// context's ops table. One mutex guards the whole fabric.
#include "fake_verbs.hpp"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <mutex>

// verbs.h routes these through inline wrappers; define the functions.
#undef ibv_reg_mr
#undef ibv_query_port

namespace h2::transport::fake_verbs {
namespace {

std::mutex fabric;
counters stats;

struct completion {
  ibv_wc wc;
  bool send; ///< a send's completion frees a send-queue slot when polled
};

struct cq_state {
  std::deque<completion> entries;
  int capacity = 0;
  bool armed = false;
};

struct qp_state {
  rdma_cm_id* id = nullptr;
  std::uint32_t max_send = 0, max_recv = 0;
  std::uint32_t sends_outstanding = 0;
  std::deque<std::uint64_t> receives; ///< posted receive ids
  std::deque<ibv_wc> waiting;         ///< immediates that found none (RNR)
  ibv_qp* peer = nullptr;
  bool error = false;
};

struct region {
  char* addr;
  std::size_t length;
};

struct id_state {
  std::uint16_t port = 0;
  rdma_cm_id* peer = nullptr; ///< the other end of a connection
};

/// An rdma_cm event with room for its private data.
struct fake_event {
  rdma_cm_event event{};
  unsigned char private_data[64] = {};
};

ibv_device device = [] {
  ibv_device d{};
  std::strcpy(d.name, "fake_rdma0");
  d.node_type = IBV_NODE_CA;
  d.transport_type = IBV_TRANSPORT_IB;
  return d;
}();

int poll_cq(ibv_cq* cq, int n, ibv_wc* wc);
int req_notify_cq(ibv_cq* cq, int solicited_only);
int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);

ibv_context context = [] {
  ibv_context c{};
  c.device = &device;
  c.ops.poll_cq = poll_cq;
  c.ops.req_notify_cq = req_notify_cq;
  c.ops.post_send = post_send;
  c.ops.post_recv = post_recv;
  c.num_comp_vectors = 1;
  c.abi_compat = nullptr; // not an extended context: legacy entry points
  return c;
}();

std::map<ibv_cq*, cq_state> cqs;
std::map<ibv_comp_channel*, int> comp_writers; ///< write end of each pipe
std::map<ibv_qp*, qp_state> qps;
std::map<std::uint32_t, ibv_qp*> qp_numbers;
std::map<std::uint32_t, region> regions; ///< by rkey
std::map<rdma_event_channel*, int> event_writers;
std::map<rdma_cm_id*, id_state> ids;
std::map<std::uint16_t, rdma_cm_id*> listeners;
std::uint32_t next_key = 0x100, next_qp_num = 0x10;
std::uint16_t next_port = 30000;

int pipe_pair(int& read_end, int& write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    return -1;
  // A full pipe drops the notification, never blocks the fabric: the fd
  // is readable anyway.
  ::fcntl(fds[1], F_SETFL, ::fcntl(fds[1], F_GETFL, 0) | O_NONBLOCK);
  read_end = fds[0];
  write_end = fds[1];
  return 0;
}

template <class T>
void send_pointer(int fd, T* p) {
  [[maybe_unused]] const auto n = ::write(fd, &p, sizeof(p));
}

void push(ibv_cq* cq, const ibv_wc& wc, bool send) {
  auto& c = cqs.at(cq);
  if (static_cast<int>(c.entries.size()) >= c.capacity)
    ++stats.cq_overflow;
  c.entries.push_back({wc, send});
  if (c.armed && cq->channel != nullptr) {
    c.armed = false;
    send_pointer(comp_writers.at(cq->channel), cq);
  }
}

void post_event(rdma_cm_id* id, rdma_cm_event_type type, int status = 0,
                rdma_cm_id* listen_id = nullptr,
                const void* private_data = nullptr, std::uint8_t len = 0) {
  auto* e = new fake_event;
  e->event.id = id;
  e->event.listen_id = listen_id;
  e->event.event = type;
  e->event.status = status;
  if (private_data != nullptr) {
    std::memcpy(e->private_data, private_data, len);
    e->event.param.conn.private_data = e->private_data;
    e->event.param.conn.private_data_len = len;
  }
  rdma_event_channel* ch =
    listen_id != nullptr ? listen_id->channel : id->channel;
  send_pointer(event_writers.at(ch), &e->event);
}

/// An immediate arrives at `q`: it takes the oldest posted receive.
void deliver(qp_state& q, ibv_wc wc) {
  if (q.receives.empty()) {
    ++stats.rnr;
    q.waiting.push_back(wc);
    return;
  }
  wc.wr_id = q.receives.front();
  q.receives.pop_front();
  ++stats.notifications;
  push(q.id->qp->recv_cq, wc, false);
}

void flush_receives(ibv_qp* qp, qp_state& q) {
  for (std::uint64_t id : q.receives) {
    ibv_wc wc{};
    wc.wr_id = id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.qp_num = qp->qp_num;
    push(qp->recv_cq, wc, false);
  }
  q.receives.clear();
}

int poll_cq(ibv_cq* cq, int n, ibv_wc* wc) {
  std::lock_guard<std::mutex> guard(fabric);
  auto& c = cqs.at(cq);
  int got = 0;
  while (got < n && !c.entries.empty()) {
    const completion e = c.entries.front();
    c.entries.pop_front();
    if (e.send) {
      auto it = qp_numbers.find(e.wc.qp_num);
      if (it != qp_numbers.end())
        --qps.at(it->second).sends_outstanding;
    }
    wc[got++] = e.wc;
  }
  return got;
}

int req_notify_cq(ibv_cq* cq, int) {
  std::lock_guard<std::mutex> guard(fabric);
  cqs.at(cq).armed = true;
  return 0;
}

int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  std::lock_guard<std::mutex> guard(fabric);
  auto& q = qps.at(qp);
  for (ibv_send_wr* w = wr; w != nullptr; w = w->next) {
    if (q.sends_outstanding >= q.max_send) {
      ++stats.send_overflow;
      *bad = w;
      return ENOMEM;
    }
    ++q.sends_outstanding;
    ibv_wc wc{};
    wc.wr_id = w->wr_id;
    wc.qp_num = qp->qp_num;
    wc.status = IBV_WC_SUCCESS;
    qp_state* peer = q.peer != nullptr ? &qps.at(q.peer) : nullptr;
    if (q.error || peer == nullptr || peer->error) {
      // Our own queue pair flushes; a vanished peer never answers.
      wc.status = q.error ? IBV_WC_WR_FLUSH_ERR : IBV_WC_RETRY_EXC_ERR;
      push(qp->send_cq, wc, true);
      continue;
    }
    std::uint32_t bytes = 0;
    for (int i = 0; i < w->num_sge; ++i)
      bytes += w->sg_list[i].length;
    ibv_wc arrival{};
    arrival.qp_num = q.peer->qp_num;
    arrival.status = IBV_WC_SUCCESS;
    arrival.imm_data = w->imm_data;
    arrival.wc_flags = IBV_WC_WITH_IMM;
    switch (w->opcode) {
      case IBV_WR_RDMA_WRITE:
      case IBV_WR_RDMA_WRITE_WITH_IMM: {
        if (bytes > 0) {
          auto r = regions.find(w->wr.rdma.rkey);
          const auto at = w->wr.rdma.remote_addr;
          if (r == regions.end() ||
              at < reinterpret_cast<std::uint64_t>(r->second.addr) ||
              at + bytes > reinterpret_cast<std::uint64_t>(r->second.addr) +
                             r->second.length) {
            ++stats.remote_access;
            wc.status = IBV_WC_REM_ACCESS_ERR;
            push(qp->send_cq, wc, true);
            continue;
          }
          char* to = reinterpret_cast<char*>(at);
          for (int i = 0; i < w->num_sge; ++i) {
            std::memcpy(to, reinterpret_cast<const void*>(w->sg_list[i].addr),
                        w->sg_list[i].length);
            to += w->sg_list[i].length;
          }
        }
        ++stats.writes;
        wc.opcode = IBV_WC_RDMA_WRITE;
        if (w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
          arrival.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
          arrival.byte_len = bytes;
          deliver(*peer, arrival);
        }
        break;
      }
      case IBV_WR_SEND_WITH_IMM:
        wc.opcode = IBV_WC_SEND;
        arrival.opcode = IBV_WC_RECV;
        arrival.byte_len = 0;
        deliver(*peer, arrival);
        break;
      default:
        wc.status = IBV_WC_LOC_QP_OP_ERR;
        break;
    }
    push(qp->send_cq, wc, true);
  }
  return 0;
}

int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  std::lock_guard<std::mutex> guard(fabric);
  auto& q = qps.at(qp);
  for (ibv_recv_wr* w = wr; w != nullptr; w = w->next) {
    if (q.receives.size() >= q.max_recv) {
      ++stats.recv_overflow;
      *bad = w;
      return ENOMEM;
    }
    if (q.error) {
      ibv_wc wc{};
      wc.wr_id = w->wr_id;
      wc.status = IBV_WC_WR_FLUSH_ERR;
      wc.qp_num = qp->qp_num;
      push(qp->recv_cq, wc, false);
      continue;
    }
    q.receives.push_back(w->wr_id);
    while (!q.waiting.empty() && !q.receives.empty()) {
      ibv_wc wc = q.waiting.front();
      q.waiting.pop_front();
      deliver(q, wc);
    }
  }
  return 0;
}

void unlink_qp(ibv_qp* qp) {
  for (auto& [other, s] : qps)
    if (s.peer == qp)
      s.peer = nullptr;
}

} // namespace

counters totals() {
  std::lock_guard<std::mutex> guard(fabric);
  counters c = stats;
  c.live_queue_pairs = qps.size();
  return c;
}

} // namespace h2::transport::fake_verbs

using namespace h2::transport::fake_verbs;

// -- verbs --------------------------------------------------------------------

ibv_device** ibv_get_device_list(int* num_devices) {
  static ibv_device* list[] = {&device, nullptr};
  if (num_devices != nullptr)
    *num_devices = 1;
  return list;
}

void ibv_free_device_list(ibv_device**) {
}

const char* ibv_get_device_name(ibv_device* d) {
  return d->name;
}

ibv_context* ibv_open_device(ibv_device*) {
  return &context;
}

int ibv_close_device(ibv_context*) {
  return 0;
}

int ibv_query_device(ibv_context*, ibv_device_attr* attr) {
  *attr = {};
  attr->phys_port_cnt = 1;
  attr->max_qp_wr = 16384;
  attr->max_cqe = 65536;
  return 0;
}

int ibv_query_port(ibv_context*, uint8_t, _compat_ibv_port_attr* attr) {
  reinterpret_cast<ibv_port_attr*>(attr)->state = IBV_PORT_ACTIVE;
  return 0;
}

ibv_pd* ibv_alloc_pd(ibv_context* c) {
  auto* pd = new ibv_pd{};
  pd->context = c;
  return pd;
}

int ibv_dealloc_pd(ibv_pd* pd) {
  delete pd;
  return 0;
}

ibv_comp_channel* ibv_create_comp_channel(ibv_context* c) {
  std::lock_guard<std::mutex> guard(fabric);
  auto* ch = new ibv_comp_channel{};
  ch->context = c;
  int w = -1;
  if (pipe_pair(ch->fd, w) != 0) {
    delete ch;
    return nullptr;
  }
  comp_writers[ch] = w;
  return ch;
}

int ibv_destroy_comp_channel(ibv_comp_channel* ch) {
  std::lock_guard<std::mutex> guard(fabric);
  ::close(comp_writers.at(ch));
  comp_writers.erase(ch);
  ::close(ch->fd);
  delete ch;
  return 0;
}

ibv_cq* ibv_create_cq(ibv_context* c, int cqe, void* cq_context,
                      ibv_comp_channel* channel, int) {
  std::lock_guard<std::mutex> guard(fabric);
  auto* cq = new ibv_cq{};
  cq->context = c;
  cq->channel = channel;
  cq->cq_context = cq_context;
  cq->cqe = cqe;
  cqs[cq].capacity = cqe;
  return cq;
}

int ibv_destroy_cq(ibv_cq* cq) {
  std::lock_guard<std::mutex> guard(fabric);
  cqs.erase(cq);
  delete cq;
  return 0;
}

int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq,
                     void** cq_context) {
  ibv_cq* got = nullptr;
  if (::read(channel->fd, &got, sizeof(got)) != sizeof(got))
    return -1; // errno: EAGAIN from the non-blocking pipe
  *cq = got;
  *cq_context = got->cq_context;
  return 0;
}

void ibv_ack_cq_events(ibv_cq*, unsigned int) {
}

ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int) {
  std::lock_guard<std::mutex> guard(fabric);
  auto* mr = new ibv_mr{};
  mr->context = pd->context;
  mr->pd = pd;
  mr->addr = addr;
  mr->length = length;
  mr->lkey = mr->rkey = next_key++;
  regions[mr->rkey] = {static_cast<char*>(addr), length};
  return mr;
}

ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) {
  errno = EOPNOTSUPP; // no device memory here
  return nullptr;
}

int ibv_dereg_mr(ibv_mr* mr) {
  std::lock_guard<std::mutex> guard(fabric);
  regions.erase(mr->rkey);
  delete mr;
  return 0;
}

const char* ibv_wc_status_str(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS:
      return "success";
    case IBV_WC_WR_FLUSH_ERR:
      return "Work Request Flushed Error";
    case IBV_WC_RETRY_EXC_ERR:
      return "transport retry counter exceeded";
    case IBV_WC_REM_ACCESS_ERR:
      return "remote access error";
    default:
      return "fake error";
  }
}

// -- rdma_cm ------------------------------------------------------------------

rdma_event_channel* rdma_create_event_channel() {
  std::lock_guard<std::mutex> guard(fabric);
  auto* ch = new rdma_event_channel{};
  int w = -1;
  if (pipe_pair(ch->fd, w) != 0) {
    delete ch;
    return nullptr;
  }
  event_writers[ch] = w;
  return ch;
}

void rdma_destroy_event_channel(rdma_event_channel* ch) {
  std::lock_guard<std::mutex> guard(fabric);
  ::fcntl(ch->fd, F_SETFL, ::fcntl(ch->fd, F_GETFL, 0) | O_NONBLOCK);
  rdma_cm_event* e = nullptr;
  while (::read(ch->fd, &e, sizeof(e)) == sizeof(e)) // events nobody read
    delete reinterpret_cast<fake_event*>(e);
  ::close(event_writers.at(ch));
  event_writers.erase(ch);
  ::close(ch->fd);
  delete ch;
}

int rdma_get_cm_event(rdma_event_channel* ch, rdma_cm_event** event) {
  rdma_cm_event* e = nullptr;
  if (::read(ch->fd, &e, sizeof(e)) != sizeof(e))
    return -1;
  *event = e;
  return 0;
}

int rdma_ack_cm_event(rdma_cm_event* event) {
  delete reinterpret_cast<fake_event*>(event); // `event` is its first member
  return 0;
}

int rdma_create_id(rdma_event_channel* ch, rdma_cm_id** id, void* ctx,
                   rdma_port_space ps) {
  std::lock_guard<std::mutex> guard(fabric);
  auto* i = new rdma_cm_id{};
  i->channel = ch;
  i->context = ctx;
  i->ps = ps;
  ids[i];
  *id = i;
  return 0;
}

int rdma_destroy_id(rdma_cm_id* id) {
  std::lock_guard<std::mutex> guard(fabric);
  auto& s = ids.at(id);
  if (s.peer != nullptr && ids.count(s.peer) != 0)
    ids.at(s.peer).peer = nullptr;
  for (auto it = listeners.begin(); it != listeners.end();)
    it = it->second == id ? listeners.erase(it) : std::next(it);
  ids.erase(id);
  delete id;
  return 0;
}

int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
  std::lock_guard<std::mutex> guard(fabric);
  if (addr->sa_family != AF_INET) {
    errno = EAFNOSUPPORT;
    return -1;
  }
  auto in = *reinterpret_cast<sockaddr_in*>(addr);
  if (in.sin_port == 0)
    in.sin_port = htons(next_port++);
  id->route.addr.src_sin = in;
  id->verbs = &context;
  ids.at(id).port = ntohs(in.sin_port);
  return 0;
}

int rdma_listen(rdma_cm_id* id, int) {
  std::lock_guard<std::mutex> guard(fabric);
  listeners[ids.at(id).port] = id;
  return 0;
}

__be16 rdma_get_src_port(rdma_cm_id* id) {
  return id->route.addr.src_sin.sin_port;
}

int rdma_resolve_addr(rdma_cm_id* id, sockaddr*, sockaddr* dst, int) {
  std::lock_guard<std::mutex> guard(fabric);
  if (dst->sa_family != AF_INET) {
    errno = EAFNOSUPPORT;
    return -1;
  }
  id->route.addr.dst_sin = *reinterpret_cast<sockaddr_in*>(dst);
  id->verbs = &context;
  post_event(id, RDMA_CM_EVENT_ADDR_RESOLVED);
  return 0;
}

int rdma_resolve_route(rdma_cm_id* id, int) {
  std::lock_guard<std::mutex> guard(fabric);
  post_event(id, RDMA_CM_EVENT_ROUTE_RESOLVED);
  return 0;
}

int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* attr) {
  std::lock_guard<std::mutex> guard(fabric);
  auto* qp = new ibv_qp{};
  qp->context = &context;
  qp->pd = pd;
  qp->send_cq = attr->send_cq;
  qp->recv_cq = attr->recv_cq;
  qp->qp_num = next_qp_num++;
  qp->qp_type = attr->qp_type;
  qp->state = IBV_QPS_INIT;
  auto& s = qps[qp];
  s.id = id;
  s.max_send = attr->cap.max_send_wr;
  s.max_recv = attr->cap.max_recv_wr;
  qp_numbers[qp->qp_num] = qp;
  ++stats.queue_pairs;
  id->qp = qp;
  return 0;
}

void rdma_destroy_qp(rdma_cm_id* id) {
  std::lock_guard<std::mutex> guard(fabric);
  ibv_qp* qp = id->qp;
  unlink_qp(qp);
  qp_numbers.erase(qp->qp_num);
  qps.erase(qp);
  delete qp;
  id->qp = nullptr;
}

int rdma_connect(rdma_cm_id* id, rdma_conn_param* param) {
  std::lock_guard<std::mutex> guard(fabric);
  auto l = listeners.find(ntohs(id->route.addr.dst_sin.sin_port));
  if (l == listeners.end()) {
    post_event(id, RDMA_CM_EVENT_REJECTED, 28);
    return 0;
  }
  auto* request = new rdma_cm_id{};
  request->channel = l->second->channel;
  request->verbs = &context;
  request->ps = RDMA_PS_TCP;
  ids[request].peer = id;
  ids.at(id).peer = request;
  post_event(request, RDMA_CM_EVENT_CONNECT_REQUEST, 0, l->second,
             param->private_data, param->private_data_len);
  return 0;
}

int rdma_accept(rdma_cm_id* id, rdma_conn_param*) {
  std::lock_guard<std::mutex> guard(fabric);
  rdma_cm_id* dialer = ids.at(id).peer;
  if (dialer == nullptr || id->qp == nullptr || dialer->qp == nullptr) {
    errno = EINVAL;
    return -1;
  }
  qps.at(id->qp).peer = dialer->qp;
  qps.at(dialer->qp).peer = id->qp;
  id->qp->state = dialer->qp->state = IBV_QPS_RTS;
  post_event(id, RDMA_CM_EVENT_ESTABLISHED);
  post_event(dialer, RDMA_CM_EVENT_ESTABLISHED);
  return 0;
}

int rdma_reject(rdma_cm_id* id, const void*, uint8_t) {
  std::lock_guard<std::mutex> guard(fabric);
  rdma_cm_id* dialer = ids.at(id).peer;
  if (dialer != nullptr) {
    post_event(dialer, RDMA_CM_EVENT_REJECTED, 28);
    ids.at(dialer).peer = nullptr;
    ids.at(id).peer = nullptr;
  }
  return 0;
}

int rdma_migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
  std::lock_guard<std::mutex> guard(fabric);
  id->channel = channel;
  return 0;
}

int rdma_disconnect(rdma_cm_id* id) {
  std::lock_guard<std::mutex> guard(fabric);
  if (id->qp == nullptr) {
    errno = EINVAL;
    return -1;
  }
  auto& q = qps.at(id->qp);
  q.error = true;
  id->qp->state = IBV_QPS_ERR;
  flush_receives(id->qp, q);
  if (rdma_cm_id* peer = ids.at(id).peer; peer != nullptr)
    post_event(peer, RDMA_CM_EVENT_DISCONNECTED);
  return 0;
}

const char* rdma_event_str(rdma_cm_event_type event) {
  switch (event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      return "RDMA_CM_EVENT_ADDR_RESOLVED";
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      return "RDMA_CM_EVENT_ROUTE_RESOLVED";
    case RDMA_CM_EVENT_CONNECT_REQUEST:
      return "RDMA_CM_EVENT_CONNECT_REQUEST";
    case RDMA_CM_EVENT_ESTABLISHED:
      return "RDMA_CM_EVENT_ESTABLISHED";
    case RDMA_CM_EVENT_REJECTED:
      return "RDMA_CM_EVENT_REJECTED";
    case RDMA_CM_EVENT_DISCONNECTED:
      return "RDMA_CM_EVENT_DISCONNECTED";
    default:
      return "RDMA_CM_EVENT_(other)";
  }
}
