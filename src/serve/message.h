// One ZeroMQ message part, owned: initialised empty, closed when it goes. The server and the
// served client both receive into it.
#pragma once

#include <cstddef>

#include <zmq.h>

namespace tpdraft::serve {

struct Message {
  zmq_msg_t msg;
  Message() { zmq_msg_init(&msg); }
  ~Message() { zmq_msg_close(&msg); }
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;
  const char* data() const { return static_cast<const char*>(zmq_msg_data(const_cast<zmq_msg_t*>(&msg))); }
  size_t size() const { return zmq_msg_size(const_cast<zmq_msg_t*>(&msg)); }
};

}  // namespace tpdraft::serve
